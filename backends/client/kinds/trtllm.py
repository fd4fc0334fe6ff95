"""TensorRT-LLM's `trtllm-serve`: `cache_salt`, its disaggregated parameters and `response_format`
are sent as they are; KV events are polled from `POST /kv_cache_events` (its own JSON, which
drains on every read). It serves no `/load`, and `return_token_ids` is not asked for unless the
backend's `return_token_ids = true` says it takes it."""

from __future__ import annotations

from backends.client.kinds.base import BackendKind

TRTLLM = BackendKind(
    name="trtllm",
    kv_events="poll",
    cached_tokens_fix="run a trtllm-serve that reports usage.prompt_tokens_details (with KV cache reuse enabled)",
)
