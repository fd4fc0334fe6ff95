"""The local store's per-request writes on the event loop (gateway/store/local/file.py): they go
to the worker whenever they could block or overtake, and the WAL is still checkpointed."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import gateway.store.local.file as file_module
from gateway.settings import GatewaySettings
from gateway.store import Store
from gateway.store import open_store as open_local_store
from gateway.store.local.budgets import BudgetBook
from gateway.store.local.file import LocalFile
from tests.gateway.store.calls import reserve_budget
from tests.gateway.store.test_ledger import record


def open_store(path: Path) -> Store:
    return open_local_store(GatewaySettings(redis_url=None, sqlite_path=str(path)).store)


def local_file(store: Store) -> LocalFile:
    """The store's SQLite file and worker (the local ledger keeps them)."""
    return store.ledger._file  # type: ignore[attr-defined, no-any-return]


def budget_book(store: Store) -> BudgetBook:
    return store.admission._budgets  # type: ignore[attr-defined, no-any-return]


def spent_on_disk(path: Path, tenant_id: str, month: str) -> int:
    with sqlite3.connect(path) as conn:
        row = conn.execute(
            "SELECT spent_micro FROM budget_spend WHERE tenant_id = ? AND month = ?", (tenant_id, month)
        ).fetchone()
    return int(row[0])


async def test_writes_are_made_on_the_loop_when_the_worker_is_idle(tmp_path: Path) -> None:
    store = open_store(tmp_path / "gateway.sqlite3")
    try:
        loop_thread = threading.get_ident()
        threads: list[int] = []
        here = local_file(store)._db_on_loop
        assert here is not None
        insert = here.insert_usages

        def watched(*args: object) -> list[bool]:
            threads.append(threading.get_ident())
            return insert(*args)  # type: ignore[arg-type]

        here.insert_usages = watched  # type: ignore[method-assign]
        assert await store.ledger.append(record("r1", 100.0))
        assert threads == [loop_thread]
        assert await store.ledger.get("r1") == record("r1", 100.0)  # read back on the worker's connection
    finally:
        await store.aclose()


async def test_a_file_locked_by_another_process_never_blocks_the_loop(tmp_path: Path) -> None:
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process (the CLI) holds the write lock
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        appending = asyncio.create_task(store.ledger.append(record("r1", 100.0)))
        await asyncio.sleep(0.3)
        assert not appending.done()  # waiting on the worker, within the busy timeout ...
        assert ticks >= 10  # ... while the loop goes on
        other.execute("COMMIT")
        assert await asyncio.wait_for(appending, 5)
        ticker.cancel()
        assert await store.ledger.get("r1") == record("r1", 100.0)
    finally:
        other.close()
        await store.aclose()


async def test_a_write_never_overtakes_one_queued_on_the_worker(tmp_path: Path) -> None:
    """Budget saves write the whole spend: one that overtook an earlier queued save would be undone by it."""
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    release = threading.Event()
    try:
        busy = asyncio.ensure_future(local_file(store).run(release.wait, 5))  # the worker is busy ...
        await reserve_budget(store, "acme", "2026-05", 100, None)
        first = asyncio.ensure_future(budget_book(store).flush())
        await asyncio.sleep(0.05)  # ... so the first save is queued behind it
        assert not first.done()
        await reserve_budget(store, "acme", "2026-05", 50, None)
        second = asyncio.ensure_future(budget_book(store).flush())
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(busy, first, second)
        assert spent_on_disk(path, "acme", "2026-05") == 150
    finally:
        release.set()
        await store.aclose()


async def test_the_wal_is_checkpointed_on_the_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def wal_size_after_appends(name: str) -> int:
        path = tmp_path / name
        store = open_store(path)
        try:
            for i in range(300):
                await store.ledger.append(record(f"r{i}", 100.0 + i))
                await asyncio.sleep(0)  # a checkpoint, once asked for, runs meanwhile
            return (path.parent / f"{name}-wal").stat().st_size
        finally:
            await store.aclose()

    monkeypatch.setattr(file_module, "CHECKPOINT_EVERY", 10**9)
    unchecked = await wal_size_after_appends("never.sqlite3")
    monkeypatch.setattr(file_module, "CHECKPOINT_EVERY", 16)
    checkpointed = await wal_size_after_appends("often.sqlite3")
    assert unchecked > 4 * checkpointed, (unchecked, checkpointed)


async def test_memory_databases_keep_every_write_on_the_worker() -> None:
    store = open_local_store(GatewaySettings(redis_url=None, sqlite_path=":memory:").store)
    try:
        assert local_file(store)._db_on_loop is None
        started = time.monotonic()
        assert await store.ledger.append(record("r1", 100.0))
        assert time.monotonic() - started < 5
        assert await store.ledger.get("r1") == record("r1", 100.0)
    finally:
        await store.aclose()


def wal_salt(path: Path) -> bytes:
    """The WAL header's salts: new ones each time a writer starts the WAL over, which syncs it."""
    with open(path.parent / f"{path.name}-wal", "rb") as wal:
        return wal.read(24)[16:24]


Wrap = Callable[[str, str, Callable[..., Any]], Callable[..., Any]]


def wrap_writes(store: Store, names: Sequence[str], wrap: Wrap) -> None:
    """Replace each method of `names` on the store's two connections by `wrap(where, name, method)`,
    `where` being "loop" or "worker"."""
    for where, db in (("loop", local_file(store)._db_on_loop), ("worker", local_file(store).db)):
        for name in names:
            setattr(db, name, wrap(where, name, getattr(db, name)))


def watch_wal_restarts(store: Store, path: Path) -> dict[str, int]:
    """How many of the store's writes started the WAL over, on the loop's connection and on the worker's."""
    restarts = {"loop": 0, "worker": 0}

    def watched(where: str, _name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: object) -> Any:
            before = wal_salt(path)
            try:
                return method(*args)
            finally:
                restarts[where] += wal_salt(path) != before

        return call

    wrap_writes(store, ("insert_usages", "save_budgets"), watched)
    return restarts


async def test_the_wal_starts_over_on_the_worker_never_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first write after a complete checkpoint writes the WAL's header again and syncs it (fdatasync,
    even with synchronous=NORMAL): that write must not be one made on the loop."""
    monkeypatch.setattr(file_module, "CHECKPOINT_EVERY", 8)
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    restarts = watch_wal_restarts(store, path)
    try:
        for i in range(100):
            await store.ledger.append(record(f"r{i}", 100.0 + i))
            await reserve_budget(store, "acme", "2026-05", 10, None)
            while local_file(store)._checkpointing is not None:  # a quiet moment: a checkpoint, once asked for, ends
                await asyncio.sleep(0.001)
        assert restarts["loop"] == 0, restarts
        assert restarts["worker"] >= 5, restarts  # the WAL did start over, each time on the worker
    finally:
        await store.aclose()


async def test_the_worker_never_checkpoints_of_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes that went to the worker (it was busy) grow the WAL too: past wal_autocheckpoint's 1000
    pages a commit on the worker's connection would checkpoint, and the next write, on the loop,
    would start the WAL over (and sync it). The store's own checkpoints are the only ones."""
    monkeypatch.setattr(file_module, "CHECKPOINT_EVERY", 10**9)
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    restarts = watch_wal_restarts(store, path)
    try:
        for i in range(600):
            # a read keeps the worker busy, so the ledger record goes to the worker; the budget, on the loop
            await asyncio.gather(store.ledger.get("r0"), store.ledger.append(record(f"r{i}", 100.0 + i)))
            await reserve_budget(store, "acme", "2026-05", 10, None)
        assert restarts["loop"] == 0, restarts
    finally:
        await store.aclose()


async def test_writes_made_on_the_worker_are_checkpointed_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under load the worker is rarely idle and most writes go to it: they count towards the next checkpoint.
    (Every 8: a record's transaction writes its hour's sums too, about 4 pages where it wrote 3.)"""
    monkeypatch.setattr(file_module, "CHECKPOINT_EVERY", 8)
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    try:
        for i in range(600):  # a read keeps the worker busy, so every write goes to it
            await asyncio.gather(store.ledger.get("r0"), store.ledger.append(record(f"r{i}", 100.0 + i)))
        assert (path.parent / f"{path.name}-wal").stat().st_size < 100 * 4096
    finally:
        await store.aclose()


async def test_no_checkpoint_is_started_once_the_store_closes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A request that settles while the store closes must not start a checkpoint that runs after the
    file closed (its error would surface as an unretrieved task exception)."""
    monkeypatch.setattr(file_module, "CHECKPOINT_EVERY", 1)
    errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
    store = open_store(tmp_path / "gateway.sqlite3")
    closing = asyncio.create_task(store.aclose())
    await asyncio.sleep(0)  # aclose has queued the file's close on the worker
    with pytest.raises(sqlite3.ProgrammingError):  # the file is closed: the write fails, as any after aclose
        await store.ledger.append(record("r1", 100.0))
    await closing
    for _ in range(3):
        await asyncio.sleep(0.01)
    gc.collect()
    assert errors == []


async def test_a_failing_checkpoint_is_logged_and_the_store_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_module, "CHECKPOINT_EVERY", 1)
    errors: list[dict[str, object]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
    store = open_store(tmp_path / "gateway.sqlite3")
    try:
        def broken() -> None:
            raise sqlite3.DatabaseError("database disk image is malformed")

        monkeypatch.setattr(local_file(store).db, "checkpoint", broken)
        for i in range(3):
            assert await store.ledger.append(record(f"r{i}", 100.0 + i))
            await asyncio.sleep(0.02)  # the checkpoint asked for runs and fails
        assert local_file(store)._checkpointing is None
        assert await store.ledger.get("r2") == record("r2", 102.0)
    finally:
        await store.aclose()
    gc.collect()
    assert errors == []
