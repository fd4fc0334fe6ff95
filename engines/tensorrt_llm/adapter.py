"""In-process TensorRT-LLM: the `Engine` protocol over `tensorrt_llm.LLM` (PyTorch backend).

This is the alternative to exec'ing trtllm-serve (see launcher.py): our own backend server hosts
a `tensorrt_llm.LLM`, so /load, /metrics and the admission rules are ours. `tensorrt_llm` is
imported inside the constructor only; without it the constructor raises TrtllmUnavailable with
install instructions. It needs a GPU and cannot run in edgerun's CPU test suite, so this module
stays a thin mapping:

    GenerationRequest -> LLM.generate_async(prompt ids, SamplingParams, streaming=True, cache_salt)
    RequestOutput deltas (text_diff, token_ids_diff, cached_tokens) -> GenerationOutput
    abort(request_id) -> RequestOutput.abort()
    LLM.get_kv_cache_events() (TensorRT-LLM's JSON events) -> KVCacheEvent
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from contracts.chat_tokens import ChatTokens
from engines.base import EngineStats, GenerationOutput, GenerationRequest, KVCacheEvent
from engines.errors import EngineStopped, InvalidRequest
from engines.guided import Guide
from engines.sampling_params import knobs_of
from engines.tensorrt_llm.config import TrtllmConfig, llm_api_options
from engines.tensorrt_llm.launcher import INSTALL_HINT


class TrtllmUnavailable(ImportError):
    """`tensorrt_llm` cannot be imported here; the message says how to install it."""


class _Tokenizer:
    """edgerun's Tokenizer protocol over TensorRT-LLM's (Hugging Face based) tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.eos_token_ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
        self._chat: ChatTokens | None = None

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        text: str = self._tokenizer.decode(token_ids)
        return text

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        prompt: str = self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return prompt

    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """`apply_chat_template` + `encode`, with special-token strings in the messages as plain text."""
        if self._chat is None:
            hf = getattr(self._tokenizer, "tokenizer", self._tokenizer)  # TensorRT-LLM wraps transformers' tokenizer
            fast = getattr(hf, "backend_tokenizer", None)
            if fast is None:
                raise InvalidRequest(
                    "this model's tokenizer is not a fast (tokenizers) one, which /v1/chat/completions needs to keep "
                    "special tokens out of messages: send token ids to /v1/completions"
                )
            self._chat = ChatTokens(fast)
        masked = self._chat.mask(messages)
        return self._chat.encode(self.apply_chat_template(masked.value, add_generation_prompt), masked)


class TrtllmEngine:
    """One `tensorrt_llm.LLM` behind edgerun's Engine protocol."""

    def __init__(self, config: TrtllmConfig, max_model_len: int | None = None) -> None:
        try:
            import tensorrt_llm
            from tensorrt_llm.llmapi import KvCacheConfig
        except ImportError as exc:
            raise TrtllmUnavailable(f"cannot import tensorrt_llm ({exc}).\n{INSTALL_HINT}") from exc
        self._trt = tensorrt_llm
        options = llm_api_options(config, "mixed")
        self._llm = tensorrt_llm.LLM(
            model=config.model_id,
            backend="pytorch",
            max_batch_size=options["max_batch_size"],
            max_num_tokens=options["max_num_tokens"],
            kv_cache_config=KvCacheConfig(**options["kv_cache_config"]),
            **({"max_seq_len": max_model_len} if max_model_len else {}),
        )
        self.model_name = config.model
        self.tokenizer = _Tokenizer(self._llm.tokenizer)
        self.max_model_len = max_model_len or int(getattr(self._llm.args, "max_seq_len", None) or 4096)
        self._running: dict[str, Any] = {}
        self._stopped = False
        self._num_prompt_tokens = 0
        self._num_generated_tokens = 0
        self._num_prefix_hit_tokens = 0

    async def start(self) -> None:
        pass  # the LLM is ready once constructed

    async def stop(self, timeout_s: float = 10.0) -> None:
        self._stopped = True
        for result in list(self._running.values()):
            result.abort()
        self._llm.shutdown()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        if self._stopped:
            raise EngineStopped("the TensorRT-LLM engine has stopped")
        if not request.prompt_token_ids:
            raise InvalidRequest("the prompt is empty")
        s = request.sampling
        sampling = self._trt.SamplingParams(
            max_tokens=s.max_tokens,
            **knobs_of(s),
            stop=s.stop or None,
            ignore_eos=s.ignore_eos,
        )
        if s.guide is not None:  # needs guided_decoding_backend in the LLM's options (config.py writes it)
            from tensorrt_llm.llmapi import GuidedDecodingParams

            sampling.guided_decoding = GuidedDecodingParams(**guided_decoding_fields(s.guide))
        extra = {"cache_salt": request.cache_salt} if request.cache_salt else {}
        result = self._llm.generate_async(request.prompt_token_ids, sampling, streaming=True, **extra)
        self._running[request.request_id] = result
        num_prompt = len(request.prompt_token_ids)
        self._num_prompt_tokens += num_prompt
        finished = False
        try:
            async for output in result:
                completion = output.outputs[0]
                cached = int(getattr(output, "cached_tokens", 0) or 0)
                finish = completion.finish_reason if completion.finish_reason in ("stop", "length") else None
                finished = output.finished
                if finished and finish is None:
                    finish = "abort" if completion.finish_reason == "cancelled" else "stop"
                new_ids = list(completion.token_ids_diff)
                self._num_generated_tokens += len(new_ids)
                yield GenerationOutput(
                    request_id=request.request_id,
                    new_token_ids=new_ids,
                    new_text=completion.text_diff,
                    num_prompt_tokens=num_prompt,
                    num_cached_tokens=cached,
                    num_generated_tokens=len(completion.token_ids),
                    finish_reason=finish,
                )
                if finished:
                    self._num_prefix_hit_tokens += cached
        finally:
            self._running.pop(request.request_id, None)
            if not finished:
                result.abort()

    async def abort(self, request_id: str) -> None:
        result = self._running.pop(request_id, None)
        if result is not None:
            result.abort()

    def stats(self) -> EngineStats:
        kv_total = kv_free = 0
        with contextlib.suppress(Exception):  # stats are best effort; generation never depends on them
            latest = (self._llm.get_stats(timeout=0.01) or [None])[-1]
            kv = (latest or {}).get("kvCacheStats") or {}
            kv_total, kv_free = int(kv.get("maxNumBlocks", 0)), int(kv.get("freeNumBlocks", 0))
        return EngineStats(
            num_running=len(self._running),
            num_waiting=0,  # TensorRT-LLM queues internally; it does not report the split per request
            num_prefill_tokens=0,
            num_decode_tokens=0,
            num_kv_blocks_total=kv_total,
            num_kv_blocks_free=kv_free,
            num_prefix_hit_tokens=self._num_prefix_hit_tokens,
            num_prompt_tokens=self._num_prompt_tokens,
            num_generated_tokens=self._num_generated_tokens,
        )

    def drain_kv_events(self) -> list[KVCacheEvent]:
        events: list[KVCacheEvent] = []
        for raw in self._llm.get_kv_cache_events(timeout=0.01) or []:
            data = raw.get("data") or {}
            if data.get("type") == "stored":
                blocks = data.get("blocks") or []
                events.append(
                    KVCacheEvent(
                        event_id=int(raw["event_id"]),
                        kind="stored",
                        block_hashes=[block["block_hash"] for block in blocks],
                        parent_hash=data.get("parent_hash"),
                        token_ids=[[token["token_id"] for token in block.get("tokens", [])] for block in blocks],
                    )
                )
            elif data.get("type") == "removed":
                events.append(
                    KVCacheEvent(event_id=int(raw["event_id"]), kind="removed", block_hashes=list(data["block_hashes"]))
                )
        return events


def guided_decoding_fields(guide: Guide) -> dict[str, Any]:
    """TensorRT-LLM's GuidedDecodingParams fields for `guide` (json, json_object or structural_tag)."""
    if guide.kind == "json_object":
        return {"json_object": True}
    if guide.kind == "json_schema":
        return {"json": guide.spec}
    return {"structural_tag": json.dumps({"type": "structural_tag", **guide.value})}

