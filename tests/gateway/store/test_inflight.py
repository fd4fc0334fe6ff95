from __future__ import annotations

import asyncio

import pytest

from gateway.store import InvalidArgument, Store
from tests.gateway.store.conftest import OpenStore


async def test_counts_add_up_across_replicas_and_never_go_negative(pair: tuple[Store, Store]) -> None:
    a, b = pair
    await a.add_inflight("X", 100, 10)
    await b.add_inflight("X", 50, 5)
    await b.add_inflight("Y", 0, 7)
    assert await a.loads() == {"X": (150, 15), "Y": (0, 7)}
    await a.release_inflight("X", 100, 0)
    await b.release_inflight("Y", 0, 100)  # more than was counted: stops at zero
    assert await b.loads() == {"X": (50, 15)}
    await asyncio.gather(*(s.release_inflight("X", 30, 30) for s in (a, b, a, b)))
    assert await a.loads() == {}
    await a.add_inflight("X", 1, 0)
    assert await b.loads() == {"X": (1, 0)}


async def test_concurrent_changes_are_not_lost(pair: tuple[Store, Store]) -> None:
    a, b = pair
    await asyncio.gather(*(s.add_inflight("X", 3, 1) for s in [a, b] * 50))
    assert await a.loads() == {"X": (300, 100)}
    await asyncio.gather(*(s.release_inflight("X", 3, 1) for s in [a, b] * 40))
    assert await b.loads() == {"X": (60, 20)}


async def test_correct_aligns_with_the_backend_report(kind: str, pair: tuple[Store, Store]) -> None:
    a, b = pair
    await a.add_inflight("X", 100, 0)
    await b.add_inflight("X", 50, 0)
    await a.correct_inflight("X", 120, 8)
    assert await b.loads() == {"X": (120, 8)}
    await a.correct_inflight("X", 10, 0)
    # Redis and shared: b's 50 still in flight through b are kept; embedded: one replica, the report wins.
    assert await b.loads() == {"X": (10 if kind == "embedded" else 50, 0)}
    await a.correct_inflight("X", 0, 0)
    await b.release_inflight("X", 50, 0)
    assert await a.loads() == {}


async def test_a_crashed_replicas_counts_expire_a_live_ones_do_not(kind: str, open_instance: OpenStore) -> None:
    if kind == "embedded":
        pytest.skip("embedded: the counts live in the one process and end with it")
    if kind == "hosted":
        pytest.skip("hosted: no lease; a worker's counts end with its connection, at once (test_host_process.py)")
    crashed, live, observer = (open_instance(inflight_lease_s=0.45) for _ in range(3))
    await crashed.add_inflight("X", 100, 10)
    await live.add_inflight("X", 5, 1)
    crashed._lease._task.cancel()  # type: ignore[union-attr]  # a crash: no renewals and no clean close
    assert await observer.loads() == {"X": (105, 11)}
    await asyncio.sleep(0.7)  # past the lease; the live replica renewed its lease twice meanwhile
    assert await observer.loads() == {"X": (5, 1)}
    await live.aclose()  # a clean close drops its counts at once
    assert await observer.loads() == {}


async def test_bad_counts_are_refused(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        await store.add_inflight("X", -1, 0)
    with pytest.raises(InvalidArgument):
        await store.release_inflight("", 1, 0)
