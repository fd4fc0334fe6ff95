"""TensorRT-LLM configuration, rendered from edgerun's settings into the YAML files trtllm-serve reads.

Two files come out of here (no TensorRT-LLM import is needed to write them):

* the `--extra_llm_api_options` YAML of one `trtllm-serve` worker (LLM API arguments):
  `max_batch_size`, `max_num_tokens`, `kv_cache_config`, `speculative_config` and, for the
  workers of a disaggregated deployment, `cache_transceiver_config`;
* the `trtllm-serve disaggregated -c` YAML of the front server that runs the
  context_only -> generation_only flow: `hostname`, `port`, `backend`, `context_servers` and
  `generation_servers`, each `{num_instances, urls}` with urls as "host:port".

Where the keys come from (TensorRT-LLM's own documentation and examples):

* kv_cache_config: the `tensorrt_llm.llmapi.KvCacheConfig` reference (1.x): `enable_block_reuse`
  (prefix reuse), `event_buffer_max_size` (> 0 keeps KV events for `POST /kv_cache_events`, see
  the "Get KV Cache Events" LLM API example), `tokens_per_block`, `free_gpu_memory_fraction`.
* speculative_config: docs/source/features/speculative-decoding.md ("Usage with trtllm-bench and
  trtllm-serve"): `decoding_type`, `max_draft_len`, `speculative_model` with
  `speculative_model_dir` as its documented alias; `eagle3_one_model` from the Eagle3 config. The
  1.0-era examples (tech blog 6, Llama 4 Maverick on B200) spell it `decoding_type: Eagle` with
  `speculative_model_dir`; releases after 1.2 name it `Eagle3` and keep `Eagle` only as an alias.
  N-gram: `decoding_type: NGram` with `max_draft_len` and `max_matching_ngram_size` (the
  NGramDecodingConfig reference). `max_concurrency` (speculation off above that many requests) is
  a field of DecodingBaseConfig in the 1.2+ references; it is written only when set.
  The speculative fields carry the built-in engine's names (EngineConfig), so `--speculative`,
  `--num-speculative-tokens` and `--speculative-model` configure either engine the same way.
* cache_transceiver_config: examples/disaggregated/README.md: `backend` (DEFAULT, UCX, NIXL, MPI)
  and `max_tokens_in_buffer` (>= the longest prompt for best performance); the same README sets
  `disable_overlap_scheduler: true` on context servers, which do not support the overlap scheduler.
* the disaggregated YAML: examples/disaggregated/README.md and disagg_config.yaml.
* guided_decoding_backend: docs/source/features/guided-decoding.md: `xgrammar` or `llguidance`;
  without it trtllm-serve refuses `response_format`. We write `llguidance`, the built-in engine's
  choice (BENCHMARKS.md, "Grammar masks"), so both engines read schemas the same way; None leaves it out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import yaml

Role = Literal["mixed", "prefill", "decode"]
CacheTransceiverBackend = Literal["DEFAULT", "UCX", "NIXL", "MPI"]

# Short names edgerun accepts for --model, mapped to what trtllm-serve can load.
MODEL_ALIASES = {"smollm2": "HuggingFaceTB/SmolLM2-135M-Instruct"}


@dataclass(frozen=True, slots=True)
class TrtllmConfig:
    """What one region's TensorRT-LLM deployment runs, in edgerun's terms.

    `context_servers` / `generation_servers` are "host:port" addresses of the prefill and decode
    workers; they are only needed to render the disaggregated front server's YAML.
    """

    model: str = "smollm2"
    trtllm_version: str = "1.2.0"
    tokens_per_block: int = 32
    free_gpu_memory_fraction: float = 0.9
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    event_buffer_max_size: int = 16384  # KV events kept between two polls of /kv_cache_events
    # speculative decoding: "none", "ngram" (NGram) or "eagle3" (an EAGLE-3 head in speculative_model)
    speculative: Literal["none", "ngram", "eagle3"] = "none"
    num_speculative_tokens: int = 3  # max_draft_len
    prompt_lookup_max: int = 4  # max_matching_ngram_size (NGram)
    speculative_model: str | None = None  # speculative_model_dir (EAGLE-3)
    speculative_max_concurrency: int | None = None  # max_concurrency; None: TensorRT-LLM's default
    eagle3_one_model: bool = True  # run draft and target as one fused model
    cache_transceiver_backend: CacheTransceiverBackend = "DEFAULT"
    max_tokens_in_buffer: int = 8192
    context_servers: tuple[str, ...] = ()
    generation_servers: tuple[str, ...] = ()
    disaggregated_host: str = "127.0.0.1"  # trtllm-serve checks no credentials: expose it deliberately
    disaggregated_port: int = 8000
    # grammar backend for `response_format` (JSON mode, tool calls): the built-in engine uses llguidance
    guided_decoding_backend: Literal["llguidance", "xgrammar"] | None = "llguidance"

    def __post_init__(self) -> None:
        parse_version(self.trtllm_version)  # fails early on a version we cannot place
        if self.tokens_per_block < 2 or self.tokens_per_block & (self.tokens_per_block - 1):
            raise ValueError(f"tokens_per_block={self.tokens_per_block} must be a power of two > 1")
        if not 0.0 < self.free_gpu_memory_fraction <= 1.0:
            raise ValueError(f"free_gpu_memory_fraction={self.free_gpu_memory_fraction} must be in (0, 1]")
        if self.max_batch_size < 1 or self.max_num_tokens < 1:
            raise ValueError("max_batch_size and max_num_tokens must be >= 1")
        if self.num_speculative_tokens < 1 or self.prompt_lookup_max < 1:
            raise ValueError("num_speculative_tokens and prompt_lookup_max must be >= 1")
        if self.speculative == "eagle3" and not self.speculative_model:
            raise ValueError("speculative='eagle3' needs speculative_model: the EAGLE-3 draft checkpoint")
        if self.speculative_max_concurrency is not None and self.speculative_max_concurrency < 1:
            raise ValueError("speculative_max_concurrency must be >= 1 (or unset)")
        if self.event_buffer_max_size < 1:
            raise ValueError("event_buffer_max_size must be > 0: the gateway routes on KV cache events")
        for address in (*self.context_servers, *self.generation_servers):
            if not re.fullmatch(r"[^\s:/]+:\d{1,5}", address):
                raise ValueError(f"server address {address!r} must be host:port (no scheme)")

    @property
    def model_id(self) -> str:
        return MODEL_ALIASES.get(self.model, self.model)


def parse_version(version: str) -> tuple[int, int]:
    """(major, minor) of a TensorRT-LLM version string such as "1.2.0" or "1.3.0rc4"."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"trtllm_version={version!r} is not a version like 1.2.0")
    major, minor = int(match[1]), int(match[2])
    if major < 1:
        raise ValueError(f"trtllm_version={version!r}: edgerun supports TensorRT-LLM 1.0 and later")
    return major, minor


def eagle_decoding_type(version: str) -> str:
    """`Eagle` for TensorRT-LLM 1.0-1.2, `Eagle3` after 1.2 (where `Eagle` is only an alias)."""
    return "Eagle" if parse_version(version) <= (1, 2) else "Eagle3"


def llm_api_options(config: TrtllmConfig, role: Role = "mixed") -> dict[str, Any]:
    """The `--extra_llm_api_options` mapping for one worker of `role`."""
    options: dict[str, Any] = {
        "max_batch_size": config.max_batch_size,
        "max_num_tokens": config.max_num_tokens,
        "kv_cache_config": {
            "enable_block_reuse": True,
            "event_buffer_max_size": config.event_buffer_max_size,
            "tokens_per_block": config.tokens_per_block,
            "free_gpu_memory_fraction": config.free_gpu_memory_fraction,
        },
    }
    speculative = speculative_config(config)
    if speculative is not None:
        options["speculative_config"] = speculative
    if config.guided_decoding_backend is not None:
        options["guided_decoding_backend"] = config.guided_decoding_backend
    if role == "prefill":
        options["disable_overlap_scheduler"] = True
    if role != "mixed":
        options["cache_transceiver_config"] = {
            "backend": config.cache_transceiver_backend,
            "max_tokens_in_buffer": config.max_tokens_in_buffer,
        }
    return options


def speculative_config(config: TrtllmConfig) -> dict[str, Any] | None:
    """The `speculative_config` mapping, None without speculation."""
    if config.speculative == "none":
        return None
    if config.speculative == "eagle3":
        options: dict[str, Any] = {
            "decoding_type": eagle_decoding_type(config.trtllm_version),
            "max_draft_len": config.num_speculative_tokens,
            "speculative_model_dir": config.speculative_model,
            "eagle3_one_model": config.eagle3_one_model,
        }
    else:
        options = {
            "decoding_type": "NGram",
            "max_draft_len": config.num_speculative_tokens,
            "max_matching_ngram_size": config.prompt_lookup_max,
        }
    if config.speculative_max_concurrency is not None:
        options["max_concurrency"] = config.speculative_max_concurrency
    return options


def disaggregated_options(config: TrtllmConfig) -> dict[str, Any]:
    """The `trtllm-serve disaggregated -c` mapping: the front server and its two worker pools."""
    if not config.context_servers or not config.generation_servers:
        raise ValueError("a disaggregated deployment needs at least one context and one generation server")
    return {
        "hostname": config.disaggregated_host,
        "port": config.disaggregated_port,
        "backend": "pytorch",
        "context_servers": {"num_instances": len(config.context_servers), "urls": list(config.context_servers)},
        "generation_servers": {
            "num_instances": len(config.generation_servers),
            "urls": list(config.generation_servers),
        },
    }


def to_yaml(options: dict[str, Any], comment: str = "") -> str:
    """Stable YAML text (keys in insertion order), with an optional leading comment block."""
    header = "".join(f"# {line}\n" if line else "#\n" for line in comment.splitlines())
    text: str = yaml.safe_dump(options, sort_keys=False, default_flow_style=False)
    return header + text
