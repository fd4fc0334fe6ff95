"""KV cache events on the wire: TensorRT-LLM's `POST /kv_cache_events` JSON, which our backends
send too (backends/server/kv_events.py) and the gateway's prefix index reads
(gateway/fleet/kv_index.py, which checks every field: a third-party server sends what it likes).

    {"event_id": N, "window_size": W, "data": {"type": "stored", "parent_hash": H | null,
        "blocks": [{"type": "stored_block", "block_hash": H, "cache_level": 0, "priority": P,
                    "tokens": [{"type": "unique_token", "token_id": T, "token_extra_id": 0}, ...]}]}}
    {"event_id": N, "window_size": W, "data": {"type": "removed", "block_hashes": [H, ...]}}

Hashes are `contracts.prefix_hash` chain values (signed 64-bit integers).
"""

from __future__ import annotations

from typing import Literal, TypedDict


class Token(TypedDict):
    type: Literal["unique_token"]
    token_id: int
    token_extra_id: int


class StoredBlock(TypedDict):
    type: Literal["stored_block"]
    block_hash: int
    tokens: list[Token]  # empty unless the backend is asked to reveal them
    cache_level: int
    priority: int


class Stored(TypedDict):
    type: Literal["stored"]
    parent_hash: int | None
    blocks: list[StoredBlock]


class Removed(TypedDict):
    type: Literal["removed"]
    block_hashes: list[int]


class KVEvent(TypedDict):
    event_id: int
    data: Stored | Removed
    window_size: int
