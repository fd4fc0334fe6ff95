from __future__ import annotations

import asyncio

import pytest
import redis

from gateway.store import InvalidArgument, Store
from tests.gateway.store.conftest import OpenStore

H = [(-1) ** i * (2**62 + i * 7919) for i in range(8)]  # signed 64-bit, like policies.prefix


async def test_match_counts_the_leading_run_per_backend(pair: tuple[Store, Store]) -> None:
    a, b = pair
    await a.record_prefix("A", H[:3])
    await b.record_prefix("B", H[:2])
    await a.record_prefix("C", H[1:3])  # holds later blocks but not the first: no use
    await b.record_prefix("D", [H[0], H[2]])  # a gap after the first block
    assert await b.match_prefix(H[:4]) == {"A": 3, "B": 2, "D": 1}
    assert await a.match_prefix(H[:2]) == {"A": 2, "B": 2, "D": 1}
    assert await a.match_prefix(H[5:]) == {}
    assert await a.match_prefix([]) == {}
    await b.remove_prefix("A", [H[1]])
    assert await a.match_prefix(H[:3]) == {"A": 1, "B": 2, "D": 1}
    await a.remove_prefix("B", H[:2])
    await a.remove_prefix("D", H[:3])
    await a.remove_prefix("A", H[:3])
    assert await b.match_prefix(H[:3]) == {}


async def test_entries_expire_per_backend(open_instance: OpenStore) -> None:
    store = open_instance(prefix_index_ttl_s=0.6)
    await store.record_prefix("old", H[:2])
    await asyncio.sleep(0.35)
    await store.record_prefix("new", H[:2])
    assert await store.match_prefix(H[:2]) == {"old": 2, "new": 2}
    await asyncio.sleep(0.35)
    assert await store.match_prefix(H[:2]) == {"new": 2}
    await asyncio.sleep(0.35)
    assert await store.match_prefix(H[:2]) == {}


async def test_index_is_capped_least_recently_recorded_first(
    kind: str, open_instance: OpenStore, request: pytest.FixtureRequest
) -> None:
    store = open_instance(prefix_index_max_entries=10)
    chain = list(range(1, 41))
    for i in range(0, 40, 4):
        await store.record_prefix("A", chain[i : i + 4])
        if i == 28:
            await store.record_prefix("A", chain[:2])  # recorded again: now among the newest
    assert await store.match_prefix(chain[:2]) == {"A": 2}
    assert await store.match_prefix(chain[2:4]) == {}
    assert await store.match_prefix(chain[32:]) == {"A": 8}  # the newest 10: hashes 1, 2 and 33..40
    assert await store.match_prefix(chain[31:]) == {}
    if kind == "redis":  # nothing left behind: 10 per-hash sets and the LRU
        with redis.Redis.from_url(request.getfixturevalue("redis_url")) as client:
            keys = list(client.scan_iter(match=request.getfixturevalue("redis_prefix") + "prefix*"))
        assert len(keys) == 11


async def test_bad_hashes_are_refused(store: Store) -> None:
    for bad in (["abc"], [2**63], [1.5], [True]):
        with pytest.raises(InvalidArgument, match="64-bit"):
            await store.record_prefix("A", bad)
        with pytest.raises(InvalidArgument):
            await store.match_prefix(bad)
