"""`MemoryCache`: the local store's response cache, in this process's memory.

One LRU over every tenant's entries (an `OrderedDict`, least recently used first) with a byte count:
a write beyond `cache_max_bytes` drops the least recently used entries (expired ones go first when
they are met) until it fits. Every method completes without awaiting, so each is atomic on the event
loop. TTLs never leave the process, so they run on the monotonic clock. Each process of the shared
mode (`sqlite_shared`) keeps its own cache: an answer one worker kept is a miss on another.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from gateway.store.cache import check_entry, entry_bytes
from gateway.store.settings import StoreSettings


class MemoryCache:
    def __init__(self, settings: StoreSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_entry_bytes = settings.cache_max_entry_bytes
        self._max_bytes = settings.cache_max_bytes
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[str, float, int]] = OrderedDict()  # -> value, deadline, size
        self.num_bytes = 0  # what the entries count against cache_max_bytes

    def __len__(self) -> int:
        return len(self._entries)

    async def get(self, tenant_id: str, key: str) -> str | None:
        check_entry(tenant_id, key)
        found = self._entries.get((tenant_id, key))
        if found is None:
            return None
        if found[1] <= self._clock():
            self._drop((tenant_id, key))
            return None
        self._entries.move_to_end((tenant_id, key))
        return found[0]

    async def put(self, tenant_id: str, key: str, value: str, ttl_s: float) -> bool:
        check_entry(tenant_id, key, ttl_s)
        size = entry_bytes(key, value)
        if size > min(self._max_entry_bytes, self._max_bytes):
            return False
        name = (tenant_id, key)
        if name in self._entries:
            self._drop(name)
        while self.num_bytes + size > self._max_bytes:
            self._drop(next(iter(self._entries)))
        self._entries[name] = (value, self._clock() + ttl_s, size)
        self.num_bytes += size
        return True

    def _drop(self, name: tuple[str, str]) -> None:
        self.num_bytes -= self._entries.pop(name)[2]
