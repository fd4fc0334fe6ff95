"""The local response cache's order and byte count, on a hand-driven clock."""

from __future__ import annotations

from gateway.settings import GatewaySettings
from gateway.store.cache import entry_bytes
from gateway.store.local.cache import MemoryCache
from tests.gateway.store.local.test_tables import Clock


def cache(clock: Clock, num_entries: int) -> MemoryCache:
    settings = GatewaySettings(cache_max_bytes=num_entries * entry_bytes("k0", "v" * 100)).store
    return MemoryCache(settings, clock)


async def test_the_least_recently_used_goes_first_and_bytes_are_counted() -> None:
    clock = Clock()
    memory = cache(clock, 2)
    await memory.put("acme", "k0", "v" * 100, 60)
    await memory.put("acme", "k1", "v" * 100, 60)
    assert await memory.get("acme", "k0") is not None  # k0 is now the most recently used
    await memory.put("acme", "k2", "v" * 100, 60)
    assert (await memory.get("acme", "k1"), len(memory)) == (None, 2)
    assert await memory.get("acme", "k0") is not None
    assert memory.num_bytes == 2 * entry_bytes("k0", "v" * 100)
    clock.now += 60  # both expire: a read drops them
    assert await memory.get("acme", "k0") is None and await memory.get("acme", "k2") is None
    assert (len(memory), memory.num_bytes) == (0, 0)
