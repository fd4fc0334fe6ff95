"""KV cache events on the wire: TensorRT-LLM's `POST /kv_cache_events` JSON, which our backends
send too (backends/server/kv_events.py) and the gateway's prefix index reads
(gateway/fleet/kv_index.py, which checks every field: a third-party server sends what it likes).

    {"event_id": N, "window_size": W, "data": {"type": "stored", "parent_hash": H | null,
        "blocks": [{"type": "stored_block", "block_hash": H, "cache_level": 0, "priority": P,
                    "tokens": [{"type": "unique_token", "token_id": T, "token_extra_id": 0}, ...]}]}}
    {"event_id": N, "window_size": W, "data": {"type": "removed", "block_hashes": [H, ...]}}

Hashes are `contracts.prefix_hash` chain values (signed 64-bit integers).

Where a block lives: both kinds may carry `"medium"` (vLLM's BlockStored/BlockRemoved field, with
vLLM's names): `GPU` the engine's own KV pool (whatever its device: vLLM says GPU for the pool its
attention reads), `CPU` its host-memory tier, `REGION` the pool its region's backends share
(Mooncake Store; no engine names that one, so it is ours). An event without it is about the pool.
`cache_level` says the same as a number (0 pool, 1 host tier, 2 region pool), TensorRT-LLM's way.
"""

from __future__ import annotations

from typing import Literal, NotRequired, TypedDict

MEDIUM_POOL = "GPU"
MEDIUM_HOST = "CPU"
MEDIUM_REGION = "REGION"
MEDIA = (MEDIUM_POOL, MEDIUM_HOST, MEDIUM_REGION)  # in cache_level order: nearest first


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
    medium: NotRequired[str]


class Removed(TypedDict):
    type: Literal["removed"]
    block_hashes: list[int]
    medium: NotRequired[str]


class KVEvent(TypedDict):
    event_id: int
    data: Stored | Removed
    window_size: int
