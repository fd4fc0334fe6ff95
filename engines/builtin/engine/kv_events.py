"""A bounded, thread-safe log of KV cache events, drained by whoever publishes them."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Literal

from contracts.kv_events import MEDIUM_POOL
from engines.base import KVCacheEvent
from engines.builtin.engine.host_tier import TierBlock


class KVEventLog:
    """Keeps the newest `capacity` events; older ones are dropped (counted in `num_dropped`).

    The engine thread appends, the server's event loop drains: a lock keeps the two apart.
    """

    def __init__(self, capacity: int = 10_000) -> None:
        self._events: deque[KVCacheEvent] = deque()
        self._capacity = capacity
        self._lock = threading.Lock()
        self._next_id = 0
        self.num_dropped = 0

    def stored(
        self, block_hashes: list[int], parent_hash: int | None, token_ids: list[list[int]], medium: str = MEDIUM_POOL,
    ) -> None:
        self._append("stored", block_hashes, parent_hash, token_ids, medium)

    def stored_chain(self, blocks: Sequence[TierBlock], medium: str) -> None:
        """`blocks` stored in `medium`: one event per run that continues a chain (each block's parent
        the one before it)."""
        run: list[TierBlock] = []
        for block in [*blocks, None]:
            if run and (block is None or block.parent_hash != run[-1].hash):
                self.stored([b.hash for b in run], run[0].parent_hash, [list(b.token_ids) for b in run], medium)
                run = []
            if block is not None:
                run.append(block)

    def removed(self, block_hashes: list[int], medium: str = MEDIUM_POOL) -> None:
        self._append("removed", block_hashes, None, None, medium)

    def _append(
        self, kind: Literal["stored", "removed"], block_hashes: list[int], parent_hash: int | None,
        token_ids: list[list[int]] | None, medium: str,
    ) -> None:
        with self._lock:
            self._events.append(KVCacheEvent(self._next_id, kind, block_hashes, parent_hash, token_ids, medium))
            self._next_id += 1
            if len(self._events) > self._capacity:
                self._events.popleft()
                self.num_dropped += 1

    def drain(self) -> list[KVCacheEvent]:
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events
