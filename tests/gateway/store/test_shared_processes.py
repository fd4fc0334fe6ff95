"""The shared embedded store under real contention: four OS processes on one SQLite file race for
one key's requests-per-minute, one tenant's request slots and one month's budget. Each
check-and-change is one BEGIN IMMEDIATE transaction, so the totals are exact: no limit exceeded,
no write lost."""

from __future__ import annotations

import asyncio
import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from gateway.settings import GatewaySettings
from gateway.store.embedded_shared import SharedEmbeddedStore

pytestmark = pytest.mark.slow
NUM_PROCESSES = 4
TRIES = 60  # per process, of each race


async def _race(path: str, index: int, barrier: Barrier) -> tuple[int, int, int]:
    store = SharedEmbeddedStore(GatewaySettings(redis_url=None, sqlite_path=path, sqlite_shared=True).store)
    try:
        barrier.wait(60)  # all start together ...
        allowed = sum([(await store.check_and_consume("key_a", 100, None, 0)).allowed for _ in range(TRIES)])
        slots = sum([await store.acquire_request_slot("acme", f"p{index}-{i}", 50) for i in range(TRIES)])
        reserved = sum([(await store.reserve_budget("acme", "2026-11", 7, 700)).allowed for _ in range(TRIES)])
        barrier.wait(60)  # ... and hold their slots until all are done
        return allowed, slots, reserved
    finally:
        await store.aclose()


def _child(path: str, index: int, barrier: Barrier, results: multiprocessing.Queue[tuple[int, int, int]]) -> None:
    results.put(asyncio.run(_race(path, index, barrier)))


def test_processes_racing_on_one_file_never_exceed_a_limit(tmp_path: Path) -> None:
    path = str(tmp_path / "gateway.sqlite3")
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[tuple[int, int, int]] = context.Queue()
    barrier = context.Barrier(NUM_PROCESSES)
    children = [context.Process(target=_child, args=(path, i, barrier, results)) for i in range(NUM_PROCESSES)]
    for child in children:
        child.start()
    outcomes = [results.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=30)
        assert child.exitcode == 0
    allowed, slots, reserved = (sum(column) for column in zip(*outcomes))
    assert allowed == 100  # rpm = 100 over 240 tries from 4 processes
    assert reserved == 100  # 700 / 7
    assert slots == 50  # a tenant limit of 50 requests in flight, all held until every process is done
    store = SharedEmbeddedStore(GatewaySettings(redis_url=None, sqlite_path=path, sqlite_shared=True).store)
    try:
        assert asyncio.run(store.budget_spent("acme", "2026-11")) == 700
    finally:
        asyncio.run(store.aclose())


async def test_a_file_locked_past_the_busy_timeout_is_a_store_outage(tmp_path: Path) -> None:
    import sqlite3

    from gateway.store import StoreUnavailable

    path = str(tmp_path / "gateway.sqlite3")
    store = SharedEmbeddedStore(GatewaySettings(redis_url=None, sqlite_path=path, sqlite_busy_timeout_s=0.2).store)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        assert await store.acquire_request_slot("acme", "r1", 1)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock ...
        with pytest.raises(StoreUnavailable, match="EDGERUN_SQLITE_PATH"):
            await store.check_and_consume("key_a", 10, None, 0)  # ... past the timeout: refused, nothing counted
        other.execute("ROLLBACK")
        assert all([(await store.check_and_consume("key_a", 10, None, 0)).allowed for _ in range(10)])
        assert not (await store.check_and_consume("key_a", 10, None, 0)).allowed
    finally:
        other.close()
        await store.aclose()
