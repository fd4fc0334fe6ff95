"""The shared local store under real contention: four OS processes on one SQLite file race for
one key's requests-per-minute, one tenant's request slots and one month's budget (process_race.py). Each
check-and-change is one BEGIN IMMEDIATE transaction, so the totals are exact: no limit exceeded,
no write lost."""

from __future__ import annotations

import asyncio
import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from gateway.settings import GatewaySettings
from gateway.store import open_store
from tests.gateway.store.calls import acquire_request_slot
from tests.gateway.store.local.process_race import race, run_racers

pytestmark = pytest.mark.slow


def _child(path: str, index: int, barrier: Barrier, results: multiprocessing.Queue[tuple[int, int, int]]) -> None:
    store = open_store(GatewaySettings(redis_url=None, sqlite_path=path, sqlite_shared=True).store)
    results.put(asyncio.run(race(store, index, barrier)))


def test_processes_racing_on_one_file_never_exceed_a_limit(tmp_path: Path) -> None:
    path = str(tmp_path / "gateway.sqlite3")
    run_racers(_child, path)
    store = open_store(GatewaySettings(redis_url=None, sqlite_path=path, sqlite_shared=True).store)
    try:
        assert asyncio.run(store.admission.budget_spent("acme", "2026-11")) == 700
    finally:
        asyncio.run(store.aclose())


async def test_a_file_locked_past_the_busy_timeout_is_a_store_outage(tmp_path: Path) -> None:
    import sqlite3

    from gateway.store import StoreUnavailable

    path = str(tmp_path / "gateway.sqlite3")
    store = open_store(GatewaySettings(redis_url=None, sqlite_path=path, sqlite_busy_timeout_s=0.2, sqlite_shared=True).store)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        assert await acquire_request_slot(store, "acme", "r1", 1)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock ...
        with pytest.raises(StoreUnavailable, match="EDGERUN_SQLITE_PATH"):
            await store.admission.check_and_consume("key_a", 10, None, 0)  # ... past the timeout: refused, nothing counted
        other.execute("ROLLBACK")
        assert all([(await store.admission.check_and_consume("key_a", 10, None, 0)).allowed for _ in range(10)])
        assert not (await store.admission.check_and_consume("key_a", 10, None, 0)).allowed
    finally:
        other.close()
        await store.aclose()
