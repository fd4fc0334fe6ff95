"""KV cache events in the JSON shape TensorRT-LLM's `POST /kv_cache_events` returns.

TensorRT-LLM serialises each event (tensorrt_llm/_utils.py, KVCacheEventSerializer) in the shape
`contracts.kv_events.KVEvent` spells out, so a router written for trtllm-serve reads ours
unchanged. Token ids, though, would hand the prompts of every tenant to whoever reads the events, and edgerun's gateway does not need them
(it takes the hashes as they are): each block's `tokens` is an empty list unless the backend
setting `kv_events_include_tokens` asks for them. The engine has one KV pool on one
cache level: `cache_level` is 0, `priority` TensorRT-LLM's default retention priority (35), and
`window_size` the engine's context length (full attention).
"""

from __future__ import annotations

from contracts.kv_events import KVEvent, Removed, Stored
from engines.base import KVCacheEvent

DEFAULT_PRIORITY = 35


def to_trtllm_json(event: KVCacheEvent, window_size: int, *, include_tokens: bool = False) -> KVEvent:
    data: Stored | Removed
    if event.kind == "removed":
        data = {"type": "removed", "block_hashes": list(event.block_hashes)}
    else:
        no_tokens: list[list[int]] = [[] for _ in event.block_hashes]
        token_ids = (event.token_ids or no_tokens) if include_tokens else no_tokens
        data = {
            "type": "stored",
            "parent_hash": event.parent_hash,
            "blocks": [
                {
                    "type": "stored_block",
                    "block_hash": block_hash,
                    "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in tokens],
                    "cache_level": 0,
                    "priority": DEFAULT_PRIORITY,
                }
                for block_hash, tokens in zip(event.block_hashes, token_ids, strict=True)
            ],
        }
    return {"event_id": event.event_id, "data": data, "window_size": window_size}
