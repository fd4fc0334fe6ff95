"""The response cache (gateway/store/cache.py), once per backend: entries per tenant, their TTL, the
size cap per entry and the total bound."""

from __future__ import annotations

import asyncio

import pytest

from gateway.store import InvalidArgument, Store
from gateway.store.cache import ENTRY_OVERHEAD_BYTES, entry_bytes
from tests.gateway.store.conftest import OpenStore


async def test_an_entry_is_read_back_by_its_tenant_only(store: Store) -> None:
    assert await store.cache.get("acme", "k1") is None
    assert await store.cache.put("acme", "k1", '{"answer": "ünïcode"}', 60) is True
    assert await store.cache.get("acme", "k1") == '{"answer": "ünïcode"}'
    assert await store.cache.get("beta", "k1") is None  # the same key, another tenant
    assert await store.cache.get("acme", "k2") is None
    assert await store.cache.put("acme", "k1", "replaced", 60) is True
    assert await store.cache.get("acme", "k1") == "replaced"


async def test_an_entry_expires_after_its_ttl_and_a_write_renews_it(store: Store) -> None:
    await store.cache.put("acme", "short", "a", 0.3)
    await store.cache.put("acme", "long", "b", 30)
    await store.cache.put("acme", "renewed", "c", 0.3)
    await asyncio.sleep(0.2)
    await store.cache.put("acme", "renewed", "c2", 0.3)
    await asyncio.sleep(0.2)
    assert await store.cache.get("acme", "short") is None
    assert await store.cache.get("acme", "long") == "b"
    assert await store.cache.get("acme", "renewed") == "c2"


async def test_an_entry_over_the_cap_per_entry_is_refused(open_instance: OpenStore) -> None:
    store = open_instance(cache_max_entry_bytes=ENTRY_OVERHEAD_BYTES + 100)
    fits = "x" * (100 - len("k"))
    assert entry_bytes("k", fits) == ENTRY_OVERHEAD_BYTES + 100
    assert await store.cache.put("acme", "k", fits, 60) is True
    assert await store.cache.put("acme", "k2", "é" * 50, 60) is False  # 100 bytes in UTF-8, plus the key's 2
    assert await store.cache.get("acme", "k2") is None
    assert await store.cache.put("acme", "k", fits + "y", 60) is False  # a refused write leaves the old entry
    assert await store.cache.get("acme", "k") == fits


async def test_the_total_stays_within_its_cap(open_instance: OpenStore) -> None:
    size = entry_bytes("k00", "v" * 300)
    store = open_instance(cache_max_bytes=3 * size)
    for i in range(3):
        assert await store.cache.put("acme", f"k{i:02d}", "v" * 300, 60 + i)
    assert [await store.cache.get("acme", f"k{i:02d}") is not None for i in range(3)] == [True, True, True]
    assert await store.cache.put("beta", "k03", "v" * 300, 63)  # a fourth, of any tenant: one goes
    kept = [await store.cache.get("acme", f"k{i:02d}") is not None for i in range(3)]
    assert kept.count(True) == 2
    assert await store.cache.get("beta", "k03") is not None
    for i in range(4, 40):  # many more: never more than three at once
        await store.cache.put("acme", f"k{i:02d}", "v" * 300, 60)
    held = [i for i in range(40) if await store.cache.get("beta" if i == 3 else "acme", f"k{i:02d}") is not None]
    assert len(held) == 3 and 39 in held  # which others went is each backend's order (its module says)


async def test_a_zero_total_keeps_nothing(open_instance: OpenStore) -> None:
    store = open_instance(cache_max_bytes=0)
    assert await store.cache.put("acme", "k", "v", 60) is False
    assert await store.cache.get("acme", "k") is None


async def test_arguments_are_checked(store: Store) -> None:
    for tenant, key, ttl in [("a:b", "k", 1.0), ("acme", "", 1.0), ("acme", "a:b", 1.0), ("acme", "k" * 129, 1.0),
                             ("acme", "k", 0.0), ("acme", "k", -1.0)]:
        with pytest.raises(InvalidArgument):
            await store.cache.put(tenant, key, "v", ttl)
    with pytest.raises(InvalidArgument):
        await store.cache.get("a b", "k")
