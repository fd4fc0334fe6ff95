"""Group commit of the local store's shared mode (serial_worker.py `run_grouped`, shared_tables.py `grouped`):
the calls of one worker wake-up share one write transaction, answered only once it is committed; a
failing call undoes only its own writes; a plain call between them (another connection's write)
commits the group first instead of waiting for the lock this thread holds; a failed commit fails
each grouped caller. Real SQLite files, real threads."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.store.admission import Claim
from gateway.store.local.database import Database
from gateway.store.local.serial_worker import SerialWorker
from gateway.store.local.shared_tables import SharedTables

LEASE_S = 60.0


def acquire_slot(tables: SharedTables, tenant_id: str, request_id: str, limit: int, lease_s: float) -> bool:
    """One slot (`SharedTables.admit` asked for a slot only): True when granted."""
    refused, _, _ = tables.admit(Claim(tenant_id, request_id, slot_limit=limit), "unused", 0, 60_000, lease_s)
    return refused is None


class Counted:
    """The tables' `commit`, counting the commits that ended a transaction."""

    def __init__(self, tables: SharedTables) -> None:
        self.tables = tables
        self.commits = 0

    def __call__(self) -> None:
        if self.tables._conn.in_transaction:
            self.commits += 1
        self.tables.commit()


def _slots(path: Path) -> int:
    with sqlite3.connect(path) as conn:  # a second connection: sees only what is committed
        return int(conn.execute("SELECT count(*) FROM request_slots").fetchone()[0])


async def _in_one_wake_up(worker: SerialWorker, *calls: Awaitable[Any]) -> list[Any]:
    """Ask for `calls` while a plain call holds the worker thread, so they all run in its next wake-up;
    their results (or errors)."""
    gate = threading.Event()
    blocker = asyncio.ensure_future(worker.run(gate.wait, 5))
    await asyncio.sleep(0.05)
    asked = [asyncio.ensure_future(call) for call in calls]
    await asyncio.sleep(0)
    gate.set()
    await blocker
    return list(await asyncio.gather(*asked, return_exceptions=True))


@dataclass
class Grouped:
    path: Path
    tables: SharedTables
    commit: Counted
    worker: SerialWorker


@pytest.fixture
def grouped(tmp_path: Path) -> Iterator[Grouped]:
    """Shared tables in grouped mode on a fresh file, and a worker committing their groups."""
    path = tmp_path / "shared.sqlite3"
    tables = SharedTables(str(path), "replica-a", grouped=True)
    commit = Counted(tables)
    worker = SerialWorker("test-group", commit)
    yield Grouped(path, tables, commit, worker)
    worker.close()
    tables.close()


async def test_the_calls_of_one_wake_up_share_one_commit_and_all_count(grouped: Grouped) -> None:
    worker, tables = grouped.worker, grouped.tables
    granted = await _in_one_wake_up(
        worker, *(worker.run_grouped(acquire_slot, tables, "acme", f"r{i}", 30, LEASE_S) for i in range(40))
    )
    assert granted == [True] * 30 + [False] * 10  # the limit holds inside the group too
    assert grouped.commit.commits == 1
    assert _slots(grouped.path) == 30  # committed before the callers were answered


async def test_a_failing_call_undoes_only_its_own_writes(grouped: Grouped) -> None:
    worker, tables = grouped.worker, grouped.tables

    def half_done() -> None:
        with tables._write() as conn:
            conn.execute("INSERT INTO request_slots VALUES ('acme', 'broken', 'replica-a')")
            raise ValueError("after a write")

    first, broken, last = await _in_one_wake_up(
        worker,
        worker.run_grouped(acquire_slot, tables, "acme", "r1", 10, LEASE_S),
        worker.run_grouped(half_done),
        worker.run_grouped(acquire_slot, tables, "acme", "r2", 10, LEASE_S),
    )
    assert first is True and last is True
    assert isinstance(broken, ValueError) and str(broken) == "after a write"
    with sqlite3.connect(grouped.path) as conn:
        held = sorted(r for (r,) in conn.execute("SELECT request_id FROM request_slots"))
    assert held == ["r1", "r2"]


async def test_a_lease_undone_with_a_failing_call_is_written_again_by_the_next(grouped: Grouped) -> None:
    worker, tables = grouped.worker, grouped.tables

    def renews_then_fails() -> None:
        with tables._write() as conn:
            tables._touch(conn, time.time(), LEASE_S)
            raise ValueError("after the lease")

    await _in_one_wake_up(
        worker, worker.run_grouped(renews_then_fails), worker.run_grouped(acquire_slot, tables, "acme", "r1", 1, LEASE_S)
    )
    other = SharedTables(str(grouped.path), "replica-b")  # another process's view: r1 must count (its replica is live)
    try:
        assert acquire_slot(other, "acme", "r2", 1, LEASE_S) is False
    finally:
        other.close()


async def test_a_plain_write_on_another_connection_commits_the_group_first(grouped: Grouped) -> None:
    worker = grouped.worker
    db = Database(str(grouped.path), busy_timeout_s=0.5)  # were the group still open, this would fail after 0.5 s
    try:
        outcomes = await _in_one_wake_up(
            worker,
            worker.run_grouped(acquire_slot, grouped.tables, "acme", "r1", 10, LEASE_S),
            worker.run(db.get_or_create_secret, "signing", "s3cret"),
            worker.run(_slots, grouped.path),  # a plain call after: the group is committed by then
        )
        assert outcomes == [True, "s3cret", 1]
    finally:
        db.close()


async def test_a_failed_commit_fails_every_grouped_caller_and_no_plain_one() -> None:
    def cannot_commit() -> None:
        raise sqlite3.OperationalError("disk I/O error")

    worker = SerialWorker("test-group", cannot_commit)
    try:
        outcomes = await asyncio.gather(worker.run_grouped(int, "1"), worker.run(int, "2"),
                                        worker.run_grouped(int, "3"), return_exceptions=True)
        assert isinstance(outcomes[0], sqlite3.OperationalError)
        assert outcomes[1] == 2
        assert isinstance(outcomes[2], sqlite3.OperationalError)
    finally:
        worker.close()


def test_a_write_waits_for_another_writer_then_gives_up_at_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "shared.sqlite3"
    patient = SharedTables(str(path), "replica-a", busy_timeout_s=5.0, grouped=True)
    hasty = SharedTables(str(path), "replica-b", busy_timeout_s=0.1, grouped=True)
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        holder.execute("BEGIN IMMEDIATE")  # another process's write transaction
        threading.Timer(0.3, holder.execute, ("COMMIT",)).start()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            acquire_slot(hasty, "acme", "r0", 10, LEASE_S)
        assert acquire_slot(patient, "acme", "r1", 10, LEASE_S) is True  # taken once the holder commits
        patient.commit()
        assert _slots(path) == 1
    finally:
        holder.close()
        hasty.close()
        patient.close()
