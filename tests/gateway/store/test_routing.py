"""Routing state (gateway/store/routing.py): sessions, the prefix index and in-flight tokens, per backend."""

from __future__ import annotations

import asyncio

import pytest
import redis

from gateway.store import InvalidArgument, Store
from tests.gateway.store.calls import add_inflight, get_session, match_prefix, release_inflight, set_session
from tests.gateway.store.conftest import SHARED_BACKENDS, OpenStore, crash


@pytest.fixture(params=SHARED_BACKENDS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param

async def test_session_pins_a_backend_per_tenant(pair: tuple[Store, Store]) -> None:
    a, b = pair
    assert await get_session(a, "acme", "chat-1") is None
    await set_session(a, "acme", "chat-1", "backend-7")
    assert await get_session(b, "acme", "chat-1") == "backend-7"
    assert await get_session(b, "beta", "chat-1") is None  # the same session id from another tenant
    await set_session(b, "acme", "chat-1", "backend-2")
    assert await get_session(a, "acme", "chat-1") == "backend-2"


async def test_session_expires_after_its_ttl_and_set_renews_it(open_instance: OpenStore) -> None:
    store = open_instance(session_ttl_s=0.6)
    await set_session(store, "acme", "old", "backend-1")
    await set_session(store, "acme", "renewed", "backend-1")
    await asyncio.sleep(0.35)
    await set_session(store, "acme", "renewed", "backend-1")
    await asyncio.sleep(0.35)
    assert await get_session(store, "acme", "old") is None
    assert await get_session(store, "acme", "renewed") == "backend-1"


async def test_session_ids_are_checked(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        await set_session(store, "acme", "x" * 257, "backend-1")
    with pytest.raises(InvalidArgument):
        await set_session(store, "acme", "", "backend-1")
    with pytest.raises(InvalidArgument):
        await set_session(store, "a:b", "s", "backend-1")
    await set_session(store, "acme", "any text: even colons", "backend-1")
    assert await get_session(store, "acme", "any text: even colons") == "backend-1"


async def test_local_sessions_are_size_bounded(kind: str, open_instance: OpenStore) -> None:
    if kind != "local":
        pytest.skip("Redis bounds sessions by TTL (and its maxmemory policy); the shared store at each lease renewal")
    store = open_instance(session_max_entries=3)
    for i in range(5):
        await set_session(store, "acme", f"s{i}", f"b{i}")
    assert [await get_session(store, "acme", f"s{i}") for i in range(5)] == [None, None, "b2", "b3", "b4"]


H = [(-1) ** i * (2**62 + i * 7919) for i in range(8)]  # signed 64-bit, like policies.prefix


async def test_match_counts_the_leading_run_per_backend(pair: tuple[Store, Store]) -> None:
    a, b = pair
    await a.routing.record_prefix("A", H[:3])
    await b.routing.record_prefix("B", H[:2])
    await a.routing.record_prefix("C", H[1:3])  # holds later blocks but not the first: no use
    await b.routing.record_prefix("D", [H[0], H[2]])  # a gap after the first block
    assert await match_prefix(b, H[:4]) == {"A": 3, "B": 2, "D": 1}
    assert await match_prefix(a, H[:2]) == {"A": 2, "B": 2, "D": 1}
    assert await match_prefix(a, H[5:]) == {}
    assert await match_prefix(a, []) == {}
    await b.routing.remove_prefix("A", [H[1]])
    assert await match_prefix(a, H[:3]) == {"A": 1, "B": 2, "D": 1}
    await a.routing.remove_prefix("B", H[:2])
    await a.routing.remove_prefix("D", H[:3])
    await a.routing.remove_prefix("A", H[:3])
    assert await match_prefix(b, H[:3]) == {}


async def test_entries_expire_per_backend(open_instance: OpenStore) -> None:
    store = open_instance(prefix_index_ttl_s=0.6)
    await store.routing.record_prefix("old", H[:2])
    await asyncio.sleep(0.35)
    await store.routing.record_prefix("new", H[:2])
    assert await match_prefix(store, H[:2]) == {"old": 2, "new": 2}
    await asyncio.sleep(0.35)
    assert await match_prefix(store, H[:2]) == {"new": 2}
    await asyncio.sleep(0.35)
    assert await match_prefix(store, H[:2]) == {}


async def test_index_is_capped_least_recently_recorded_first(
    kind: str, open_instance: OpenStore, request: pytest.FixtureRequest
) -> None:
    store = open_instance(prefix_index_max_entries=10)
    chain = list(range(1, 41))
    for i in range(0, 40, 4):
        await store.routing.record_prefix("A", chain[i : i + 4])
        if i == 28:
            await store.routing.record_prefix("A", chain[:2])  # recorded again: now among the newest
    assert await match_prefix(store, chain[:2]) == {"A": 2}
    assert await match_prefix(store, chain[2:4]) == {}
    assert await match_prefix(store, chain[32:]) == {"A": 8}  # the newest 10: hashes 1, 2 and 33..40
    assert await match_prefix(store, chain[31:]) == {}
    if kind == "redis":  # nothing left behind: 10 per-hash sets and the LRU
        with redis.Redis.from_url(request.getfixturevalue("redis_url")) as client:
            keys = list(client.scan_iter(match=request.getfixturevalue("redis_prefix") + "prefix*"))
        assert len(keys) == 11


async def test_bad_hashes_are_refused(store: Store) -> None:
    for bad in (["abc"], [2**63], [1.5], [True]):
        with pytest.raises(InvalidArgument, match="64-bit"):
            await store.routing.record_prefix("A", bad)
        with pytest.raises(InvalidArgument):
            await match_prefix(store, bad)


async def test_counts_add_up_across_replicas_and_never_go_negative(pair: tuple[Store, Store]) -> None:
    a, b = pair
    await add_inflight(a, "X", 100, 10)
    await add_inflight(b, "X", 50, 5)
    await add_inflight(b, "Y", 0, 7)
    assert await a.routing.loads() == {"X": (150, 15), "Y": (0, 7)}
    await release_inflight(a, "X", 100, 0)
    await release_inflight(b, "Y", 0, 100)  # more than was counted: stops at zero
    assert await b.routing.loads() == {"X": (50, 15)}
    await asyncio.gather(*(release_inflight(s, "X", 30, 30) for s in (a, b, a, b)))
    assert await a.routing.loads() == {}
    await add_inflight(a, "X", 1, 0)
    assert await b.routing.loads() == {"X": (1, 0)}


async def test_concurrent_changes_are_not_lost(pair: tuple[Store, Store]) -> None:
    a, b = pair
    await asyncio.gather(*(add_inflight(s, "X", 3, 1) for s in [a, b] * 50))
    assert await a.routing.loads() == {"X": (300, 100)}
    await asyncio.gather(*(release_inflight(s, "X", 3, 1) for s in [a, b] * 40))
    assert await b.routing.loads() == {"X": (60, 20)}


async def test_correct_aligns_with_the_backend_report(kind: str, pair: tuple[Store, Store]) -> None:
    a, b = pair
    await add_inflight(a, "X", 100, 0)
    await add_inflight(b, "X", 50, 0)
    await a.routing.correct_inflight("X", 120, 8)
    assert await b.routing.loads() == {"X": (120, 8)}
    await a.routing.correct_inflight("X", 10, 0)
    # Redis and shared: b's 50 still in flight through b are kept; local: one replica, the report wins.
    assert await b.routing.loads() == {"X": (10 if kind == "local" else 50, 0)}
    await a.routing.correct_inflight("X", 0, 0)
    await release_inflight(b, "X", 50, 0)
    assert await a.routing.loads() == {}


async def test_a_crashed_replicas_counts_expire_a_live_ones_do_not(kind: str, open_instance: OpenStore) -> None:
    if kind == "local":
        pytest.skip("local: the counts live in the one process and end with it")
    crashed, live, observer = (open_instance(inflight_lease_s=0.45) for _ in range(3))
    await add_inflight(crashed, "X", 100, 10)
    await add_inflight(live, "X", 5, 1)
    crash(crashed)  # a crash: no renewals and no clean close
    assert await observer.routing.loads() == {"X": (105, 11)}
    await asyncio.sleep(0.7)  # past the lease; the live replica renewed its lease twice meanwhile
    assert await observer.routing.loads() == {"X": (5, 1)}
    await live.aclose()  # a clean close drops its counts at once
    assert await observer.routing.loads() == {}


async def test_bad_counts_are_refused(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        await add_inflight(store, "X", -1, 0)
    with pytest.raises(InvalidArgument):
        await release_inflight(store, "", 1, 0)
