"""The Redis response cache's bookkeeping: the bytes of expired entries are forgotten, and the entries
nearest their expiry are the ones dropped for a new one."""

from __future__ import annotations

import asyncio

import pytest
import redis

from gateway.settings import GatewaySettings
from gateway.store import open_store
from gateway.store.cache import entry_bytes

pytestmark = pytest.mark.process  # may start a server


async def test_expired_entries_are_forgotten_and_the_nearest_expiry_goes_first(redis_url: str,
                                                                               redis_prefix: str) -> None:
    size = entry_bytes("k0", "v" * 100)
    store = open_store(GatewaySettings(redis_url=redis_url, key_prefix=redis_prefix, cache_max_bytes=2 * size).store)
    raw = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        await store.cache.put("acme", "k0", "v" * 100, 0.2)
        await store.cache.put("acme", "k1", "v" * 100, 60)
        assert int(raw.get(f"{redis_prefix}cache_bytes") or 0) == 2 * size
        await asyncio.sleep(0.3)
        await store.cache.put("acme", "k2", "v" * 100, 30)  # k0 expired: its bytes are free, k1 stays
        assert await store.cache.get("acme", "k1") is not None
        assert await store.cache.get("acme", "k2") is not None
        assert int(raw.get(f"{redis_prefix}cache_bytes") or 0) == 2 * size
        await store.cache.put("beta", "k3", "v" * 100, 90)  # k2 (30 s) is nearer its expiry than k1 (60 s)
        assert await store.cache.get("acme", "k2") is None
        assert await store.cache.get("acme", "k1") is not None
        assert raw.zcard(f"{redis_prefix}cache_index") == raw.hlen(f"{redis_prefix}cache_sizes") == 2
    finally:
        raw.close()
        await store.aclose()
