"""KV cache events in the JSON shape TensorRT-LLM's `POST /kv_cache_events` returns.

TensorRT-LLM serialises each event (tensorrt_llm/_utils.py, KVCacheEventSerializer) in the shape
`contracts.kv_events.KVEvent` spells out, so a router written for trtllm-serve reads ours
unchanged. Token ids, though, would hand the prompts of every tenant to whoever reads the events, and edgerun's gateway does not need them
(it takes the hashes as they are): each block's `tokens` is an empty list unless the backend
setting `kv_events_include_tokens` asks for them. Each event says where its blocks are (were):
`medium` GPU (the engine's KV pool), CPU (its host tier) or REGION (the region's shared pool), as
vLLM names them, and `cache_level` the same as TensorRT-LLM's number (0, 1, 2); `priority` is
TensorRT-LLM's default retention priority (35), `window_size` the engine's context length (full
attention).
"""

from __future__ import annotations

from contracts.kv_events import MEDIA, KVEvent, Removed, Stored
from engines.base import KVCacheEvent

DEFAULT_PRIORITY = 35


def to_trtllm_json(event: KVCacheEvent, window_size: int, *, include_tokens: bool = False) -> KVEvent:
    data: Stored | Removed
    level = MEDIA.index(event.medium) if event.medium in MEDIA else 0
    if event.kind == "removed":
        data = {"type": "removed", "block_hashes": list(event.block_hashes), "medium": event.medium}
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
                    "cache_level": level,
                    "priority": DEFAULT_PRIORITY,
                }
                for block_hash, tokens in zip(event.block_hashes, token_ids, strict=True)
            ],
            "medium": event.medium,
        }
    return {"event_id": event.event_id, "data": data, "window_size": window_size}
