"""`edgerun backend`: run one regional backend (built-in engine, or TensorRT-LLM).

Flags override the matching BackendSettings fields (which also come from EDGERUN_* variables and
the TOML file named by EDGERUN_CONFIG). With `--engine trtllm` the process execs trtllm-serve
(see engines/tensorrt_llm/launcher.py) unless `--trtllm-in-process` is given.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from backends.server.auth import InsecureBinding, check_exposure
from backends.settings import BackendSettings

# flag dests that set the BackendSettings field of the same name, by settings section (None: top level)
_OVERRIDES: dict[str | None, tuple[str, ...]] = {
    None: ("engine_kind", "region", "role", "host", "port", "max_queue", "shutdown_timeout_s", "log_level",
           "trtllm_in_process", "allow_unauthenticated", "kv_transport", "kv_port", "kv_pin_ttl_s",
           "kv_mooncake_trusted_network", "kv_region_pool_master", "kv_advertise_host",
           "kv_region_pool_segment_mb"),
    "engine": ("device", "dtype", "mode", "weight_dtype", "block_size", "num_kv_blocks", "max_num_seqs",
               "max_num_batched_tokens", "max_model_len", "speculative_adaptive", "lora_dir",
               "max_loras", "host_tier_blocks", "host_tier_dtype"),
    "trtllm": ("trtllm_version",),
}
# flags that set the same field of both engines' sections (speculative decoding is configured one way)
_BOTH_ENGINES = ("speculative", "num_speculative_tokens", "speculative_model", "prompt_lookup_max",
                 "speculative_max_concurrency")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--engine", dest="engine_kind", choices=["builtin", "trtllm", "embedding"],
        help="which engine to host (default builtin; embedding: a sentence encoder)")
    add("--model", help='"smollm2", a .gguf file, a safetensors directory, "random:<preset>" (or a HF id for trtllm; '
        'for embedding "all-minilm-l6-v2" or a sentence-transformers directory)')
    add("--region", help="region this backend serves (reported in /load and /metrics)")
    add("--role", choices=["mixed", "prefill", "decode"], help="disaggregation role (default mixed)")
    add("--host", help="listen address (default 127.0.0.1; any other needs EDGERUN_API_KEY, see SECURITY.md)")
    add("--allow-unauthenticated", action="store_true", default=None,
        help="listen beyond loopback without EDGERUN_API_KEY (only where the network authenticates callers)")
    add("--port", type=int, help="listen port (default 8100)")
    add("--kv-transport", choices=["tcp", "mooncake"], help="how decode backends pull KV (default tcp)")
    add("--kv-mooncake-trusted-network", action="store_true", default=None,
        help="allow --kv-transport mooncake, whose ports authenticate no one (only where backends alone reach them)")
    add("--kv-port", type=int, help="KV exporter port of prefill/mixed backends (default 0: any free port)")
    add("--kv-pin-ttl", dest="kv_pin_ttl_s", type=float, help="seconds a context step's KV waits to be pulled")
    add("--host-tier-blocks", type=int,
        help="KV blocks kept in host memory after the pool evicts them, copied back on a hit (built-in engine; 0: none)")
    add("--host-tier-dtype", choices=["float16"], help="store host-tier blocks in float16 (half the bytes; not exact)")
    add("--kv-region-pool", dest="kv_region_pool_master", metavar="HOST:PORT",
        help="the region's mooncake_master: share finished prefix blocks with the region's backends (needs "
             "--host-tier-blocks and --kv-mooncake-trusted-network)")
    add("--kv-advertise-host", help="the host other backends reach this one's KV at (default: --host; loopback for 0.0.0.0)")
    add("--kv-region-pool-segment-mb", type=int, help="memory this backend lends the region's pool (default 1024)")
    add("--max-queue", type=int, help="waiting requests beyond the running batch before answering 429")
    add("--shutdown-timeout", dest="shutdown_timeout_s", type=float, help="seconds in-flight requests get at shutdown")
    add("--log-level", help="debug, info, warning or error")
    add("--device", help="cpu or cuda[:N] (built-in engine)")
    add("--dtype", choices=["float32", "bfloat16", "float16"], help="weights and KV cache dtype (built-in engine)")
    add("--mode", choices=["fast", "deterministic"],
        help="fast (default): lower-precision arithmetic per batch shape within a stated tolerance (the GGUF's "
             "4-bit weights at small batches); deterministic: the exact float32 model, batch-invariant (built-in engine)")
    add("--weight-dtype", choices=["auto", "float32", "bfloat16", "float16", "int4", "q4_1"],
        help="how linear weights are held (default auto: see EngineConfig.weight_dtype; built-in engine)")
    add("--block-size", type=int, help="tokens per KV block (built-in engine)")
    add("--num-kv-blocks", type=int, help="KV cache capacity in blocks (built-in engine)")
    add("--max-num-seqs", type=int, help="requests running at once (built-in engine)")
    add("--max-num-batched-tokens", type=int, help="tokens per engine step (built-in engine)")
    add("--max-model-len", type=int, help="context length cap")
    add("--speculative", choices=["none", "ngram", "eagle3"], help="speculative decoding: n-gram lookup or an EAGLE-3 head")
    add("--num-speculative-tokens", type=int,
        help="most drafted tokens verified per step (default 8 built-in, where each request drafts what pays; 3 trtllm)")
    add("--fixed-draft-length", dest="speculative_adaptive", action="store_false", default=None,
        help="always draft --num-speculative-tokens (built-in engine; default: adapt to each request's acceptance)")
    add("--speculative-model", help="the EAGLE-3 head's directory (config.json + safetensors)")
    add("--prompt-lookup-max", type=int, help="longest n-gram matched by --speculative ngram")
    add("--prompt-lookup-min", type=int, help="shortest n-gram matched by --speculative ngram (built-in engine)")
    add("--speculative-max-concurrency", type=int, help="no speculation with more running requests than this")
    add("--lora-dir", help="where LoRA adapters are, one PEFT directory per name (the gateway's finetunes_dir; "
        "built-in engine): a request whose model names one runs under it")
    add("--max-loras", type=int, help="LoRA adapters resident at once, least recently used unloaded (built-in engine)")
    add("--trtllm-version", help="installed TensorRT-LLM version (picks the EAGLE-3 decoding_type)")
    add("--trtllm-in-process", action="store_true", default=None, help="host tensorrt_llm.LLM in our server")


def build_settings(args: argparse.Namespace) -> BackendSettings:
    """BackendSettings with every given flag applied on top of env vars / TOML / defaults."""
    overrides: dict[str, Any] = {}
    for section, names in _OVERRIDES.items():
        for name in names:
            value = getattr(args, name, None)
            if value is not None:
                (overrides if section is None else overrides.setdefault(section, {}))[name] = value
    for name in _BOTH_ENGINES:
        if getattr(args, name, None) is not None:
            overrides.setdefault("engine", {})[name] = getattr(args, name)
            overrides.setdefault("trtllm", {})[name] = getattr(args, name)
    if getattr(args, "prompt_lookup_min", None) is not None:
        overrides.setdefault("engine", {})["prompt_lookup_min"] = args.prompt_lookup_min
    if getattr(args, "model", None):
        overrides.setdefault("engine", {})["model"] = args.model
        overrides.setdefault("trtllm", {})["model"] = args.model
        overrides["embedding_model"] = args.model
    return BackendSettings(**overrides)


def logging_options(args: argparse.Namespace) -> dict[str, Any]:
    """How the dispatcher should configure logging for this command."""
    settings = build_settings(args)
    return {"level": settings.log_level, "json": settings.log_json}


def run(args: argparse.Namespace) -> int:
    settings = build_settings(args)
    execs_trtllm_serve = settings.engine_kind == "trtllm" and not settings.trtllm_in_process
    # trtllm-serve checks no key of its own: exposing it needs the explicit opt-out
    api_key = None if execs_trtllm_serve or settings.api_key is None else settings.api_key.get_secret_value()
    try:
        check_exposure(settings.host, api_key, settings.allow_unauthenticated)
    except InsecureBinding as exc:
        hint = " (trtllm-serve checks no API key: use --trtllm-in-process to have ours check it)"
        print(f"edgerun backend: {exc}{hint if execs_trtllm_serve else ''}", file=sys.stderr)
        return 2
    if settings.engine_kind == "embedding":
        from backends.server.embedding_app import serve_embedding

        return serve_embedding(settings)
    if execs_trtllm_serve:
        from engines.tensorrt_llm.launcher import TrtllmServeMissing, launch

        try:
            launch(
                settings.trtllm,
                role=settings.role,
                host=settings.host,
                port=settings.port,
                work_dir=settings.engine.cache_dir / "trtllm",
            )
        except TrtllmServeMissing as exc:
            print(f"edgerun backend: {exc}", file=sys.stderr)
            return 2
    from backends.server.serve import serve

    return serve(settings)
