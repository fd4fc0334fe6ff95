"""`LocalQueue`: the batch queue (gateway/store/queue.py) in the local store's SQLite file.

Its own connection to the file and its own worker thread (batch work is background work: it never
waits behind, nor delays, the requests' ledger writes); every call is one `BEGIN IMMEDIATE`
transaction, so several processes sharing the file (`serve --workers N`) claim each item once. WAL
and `synchronous=NORMAL` as the rest of the file: a queued batch survives a process crash. An enqueue,
or an item given back to be claimed at once, wakes this process's waiting worker (`wait_for_work`) by
an in-process event; other processes on the file find it at their next look (their waits' timeout).

    batch_jobs   one row per batch: owner, model, item count, answered count, started, keep_until
    batch_items  one row per item: its request (dropped once answered), ready_at (enqueue time, or its
                 lease's end while claimed), the claim's token (cleared when given back), claims and
                 releases, its answer
    batch_turns  one row per tenant with unanswered items: its turn (claims go round the tenants in
                 turn order; a tenant served, or looked at with nothing ready, goes to the back)
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gateway.store.checks import check_id
from gateway.store.errors import InvalidArgument, StoreUnavailable
from gateway.store.local.database import make_private
from gateway.store.local.serial_worker import SerialWorker
from gateway.store.queue import (
    EXPIRED_PER_CALL,
    TURNS_LOOKED_AT,
    BatchState,
    ClaimedItem,
    NewBatch,
    check_bounds,
    check_lease,
    payload_bytes,
)
from gateway.store.settings import StoreSettings

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_jobs (
    id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, account_id TEXT NOT NULL, key_id TEXT NOT NULL,
    model TEXT NOT NULL, items INTEGER NOT NULL, answered INTEGER NOT NULL DEFAULT 0,
    started INTEGER NOT NULL DEFAULT 0, keep_until REAL);
CREATE INDEX IF NOT EXISTS batch_jobs_expiry ON batch_jobs (keep_until) WHERE keep_until IS NOT NULL;
CREATE INDEX IF NOT EXISTS batch_jobs_open ON batch_jobs (items, answered) WHERE keep_until IS NULL;
CREATE TABLE IF NOT EXISTS batch_items (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, batch_id TEXT NOT NULL, idx INTEGER NOT NULL,
    tenant_id TEXT NOT NULL, payload TEXT, ready_at REAL NOT NULL, token TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, released INTEGER NOT NULL DEFAULT 0, result TEXT, UNIQUE (batch_id, idx));
CREATE INDEX IF NOT EXISTS batch_items_ready ON batch_items (ready_at, seq) WHERE result IS NULL;
CREATE INDEX IF NOT EXISTS batch_items_open ON batch_items (tenant_id) WHERE result IS NULL;
CREATE INDEX IF NOT EXISTS batch_items_tenant_ready ON batch_items (tenant_id, ready_at, seq) WHERE result IS NULL;
CREATE INDEX IF NOT EXISTS batch_items_leased ON batch_items (ready_at) WHERE result IS NULL AND token IS NOT NULL;
CREATE TABLE IF NOT EXISTS batch_turns (tenant_id TEXT PRIMARY KEY, turn INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS batch_turns_order ON batch_turns (turn);
INSERT OR IGNORE INTO batch_turns SELECT DISTINCT tenant_id, 0 FROM batch_items WHERE result IS NULL;
"""
_ITEM = ("SELECT i.seq, i.batch_id, i.idx, i.payload, i.attempts, i.released, j.tenant_id, j.account_id, j.key_id,"
         " j.model FROM batch_items i JOIN batch_jobs j ON j.id = i.batch_id WHERE i.seq = ?")


class _QueueFile:
    """The queue's tables on its own connection (used by the queue's one worker thread only)."""

    def __init__(self, path: str, busy_timeout_s: float) -> None:
        if path != ":memory:":
            make_private(Path(path).expanduser())
            path = str(Path(path).expanduser())
        self.conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        with self.conn:
            self.conn.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    self.conn.execute(statement)

    def enqueue(self, batch: NewBatch, max_queued: int, max_bytes: int, now: float) -> bool:
        c = self.conn
        with c:
            c.execute("BEGIN IMMEDIATE")
            open_items, open_bytes = self.queued_items(batch.tenant_id)
            if open_items + len(batch.items) > max_queued or open_bytes + payload_bytes(batch) > max_bytes:
                return False
            try:
                c.execute("INSERT INTO batch_jobs (id, tenant_id, account_id, key_id, model, items)"
                          " VALUES (?, ?, ?, ?, ?, ?)",
                          (batch.batch_id, batch.tenant_id, batch.account_id, batch.key_id, batch.model,
                           len(batch.items)))
            except sqlite3.IntegrityError:
                raise InvalidArgument(f"batch {batch.batch_id!r} is queued already") from None
            c.executemany("INSERT INTO batch_items (batch_id, idx, tenant_id, payload, ready_at) VALUES (?, ?, ?, ?, ?)",
                          [(batch.batch_id, i, batch.tenant_id, p, now) for i, p in enumerate(batch.items)])
            c.execute("INSERT OR IGNORE INTO batch_turns VALUES (?, (SELECT coalesce(max(turn), 0) + 1 FROM batch_turns))",
                      (batch.tenant_id,))
            return True

    def _next_turn(self, tenant_ids: list[str]) -> None:
        """`tenant_ids`, in order, to the back of the turns."""
        for tenant_id in tenant_ids:
            self.conn.execute("UPDATE batch_turns SET turn = (SELECT max(turn) + 1 FROM batch_turns) WHERE tenant_id = ?",
                              (tenant_id,))

    def _fair_pick(self, now: float) -> int | None:
        """The oldest ready item of the first of the `TURNS_LOOKED_AT` tenants next in turn that has one;
        they and those before it go to the back. None: none of them has one (the oldest ready item of any
        tenant, then: a tenant further back is never starved by ones whose items all run)."""
        c = self.conn
        looked: list[str] = []
        for (tenant_id,) in c.execute("SELECT tenant_id FROM batch_turns ORDER BY turn LIMIT ?", (TURNS_LOOKED_AT,)).fetchall():
            looked.append(tenant_id)
            row = c.execute("SELECT seq FROM batch_items WHERE tenant_id = ? AND result IS NULL AND ready_at <= ?"
                            " ORDER BY ready_at, seq LIMIT 1", (tenant_id, now)).fetchone()
            if row is not None:
                self._next_turn(looked)
                return int(row[0])
        self._next_turn(looked)
        row = c.execute("SELECT seq FROM batch_items WHERE result IS NULL AND ready_at <= ? ORDER BY ready_at, seq LIMIT 1",
                        (now,)).fetchone()
        return None if row is None else int(row[0])

    def claim(self, lease_s: float, now: float) -> ClaimedItem | None:
        c = self.conn
        with c:
            c.execute("BEGIN IMMEDIATE")
            seq = self._fair_pick(now)
            if seq is None:
                return None
            row = c.execute(_ITEM, (seq,)).fetchone()
            seq, batch_id, idx, payload, attempts, released, tenant_id, account_id, key_id, model = row
            token = secrets.token_hex(8)
            c.execute("UPDATE batch_items SET ready_at = ?, token = ?, attempts = ? WHERE seq = ?",
                      (now + lease_s, token, attempts + 1, seq))
            c.execute("UPDATE batch_jobs SET started = 1 WHERE id = ? AND started = 0", (batch_id,))
        return ClaimedItem(batch_id, idx, tenant_id, account_id, key_id, model, payload, token, attempts + 1, released)

    def move(self, item: ClaimedItem, ready_at: float, released: bool) -> bool:
        """The item's claim moved to `ready_at`, if the claim is still its own (renew; release ends it)."""
        c = self.conn
        with c:
            c.execute("BEGIN IMMEDIATE")
            cursor = c.execute(
                "UPDATE batch_items SET ready_at = ?, released = released + ?,"
                " token = CASE WHEN ? THEN NULL ELSE token END WHERE batch_id = ? AND idx = ?"
                " AND token = ? AND result IS NULL",
                (ready_at, int(released), int(released), item.batch_id, item.index, item.token))
            return cursor.rowcount == 1

    def complete(self, item: ClaimedItem, result: str, keep_until: float) -> bool:
        c = self.conn
        with c:
            c.execute("BEGIN IMMEDIATE")
            cursor = c.execute("UPDATE batch_items SET result = ?, payload = NULL, token = NULL"
                               " WHERE batch_id = ? AND idx = ? AND result IS NULL", (result, item.batch_id, item.index))
            if cursor.rowcount != 1:
                return False
            c.execute("UPDATE batch_jobs SET answered = answered + 1,"
                      " keep_until = CASE WHEN answered + 1 >= items THEN ? ELSE keep_until END WHERE id = ?",
                      (keep_until, item.batch_id))
            c.execute("DELETE FROM batch_turns WHERE tenant_id = ? AND NOT EXISTS"
                      " (SELECT 1 FROM batch_items WHERE tenant_id = ? AND result IS NULL)", (item.tenant_id, item.tenant_id))
            return True

    def state(self, tenant_id: str, batch_id: str, now: float) -> BatchState | None:
        row = self.conn.execute(
            "SELECT model, items, answered, started, keep_until FROM batch_jobs WHERE id = ? AND tenant_id = ?",
            (batch_id, tenant_id)).fetchone()
        if row is None:
            return None
        model, items, answered, started, keep_until = row
        if keep_until is not None and keep_until <= now:
            return None
        if answered < items:
            return BatchState(batch_id, model, "running" if started else "queued", ())
        results = self.conn.execute("SELECT result FROM batch_items WHERE batch_id = ? ORDER BY idx", (batch_id,))
        return BatchState(batch_id, model, "done", tuple(r for (r,) in results))

    def queued_items(self, tenant_id: str) -> tuple[int, int]:
        count, size = self.conn.execute(
            "SELECT count(*), coalesce(sum(length(CAST(payload AS BLOB))), 0) FROM batch_items"
            " WHERE tenant_id = ? AND result IS NULL", (tenant_id,)).fetchone()
        return int(count), int(size)

    def depth(self, now: float) -> tuple[int, int]:
        (open_items,) = self.conn.execute(
            "SELECT coalesce(sum(items - answered), 0) FROM batch_jobs WHERE keep_until IS NULL").fetchone()
        (running,) = self.conn.execute(
            "SELECT count(*) FROM batch_items WHERE result IS NULL AND token IS NOT NULL AND ready_at > ?", (now,)
        ).fetchone()
        return int(open_items) - int(running), int(running)

    def expire(self, now: float) -> int:
        c = self.conn
        with c:
            c.execute("BEGIN IMMEDIATE")
            gone = [b for (b,) in c.execute("SELECT id FROM batch_jobs WHERE keep_until <= ? LIMIT ?",
                                            (now, EXPIRED_PER_CALL))]
            c.executemany("DELETE FROM batch_items WHERE batch_id = ?", [(b,) for b in gone])
            c.executemany("DELETE FROM batch_jobs WHERE id = ?", [(b,) for b in gone])
            return len(gone)


class LocalQueue:
    def __init__(self, settings: StoreSettings, clock: Callable[[], float] = time.time) -> None:
        self._worker = SerialWorker("edgerun-batch-queue")
        self._file = _QueueFile(settings.sqlite_path, settings.sqlite_busy_timeout_s)
        self._clock = clock
        self._work = asyncio.Event()  # set by what makes an item ready now; cleared by the waiter it wakes

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return await self._worker.run(fn, *args)
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(f"the SQLite file cannot be written ({exc}); check EDGERUN_SQLITE_PATH") from exc

    async def enqueue(self, batch: NewBatch, max_queued: int, max_bytes: int) -> bool:
        check_bounds(max_queued, max_bytes)
        queued = await self._run(self._file.enqueue, batch, max_queued, max_bytes, self._clock())
        if queued:
            self._work.set()
        return queued

    async def claim(self, lease_s: float) -> ClaimedItem | None:
        return await self._run(self._file.claim, check_lease(lease_s), self._clock())

    async def renew(self, item: ClaimedItem, lease_s: float) -> bool:
        return await self._run(self._file.move, item, self._clock() + check_lease(lease_s), False)

    async def release(self, item: ClaimedItem, retry_in_s: float) -> None:
        released = await self._run(self._file.move, item, self._clock() + max(0.0, retry_in_s), True)
        if released and retry_in_s <= 0:
            self._work.set()

    async def wait_for_work(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._work.wait()
        self._work.clear()  # the claims that follow take what was announced

    async def complete(self, item: ClaimedItem, result: str, keep_s: float) -> bool:
        return await self._run(self._file.complete, item, result, self._clock() + check_lease(keep_s))

    async def state(self, tenant_id: str, batch_id: str) -> BatchState | None:
        check_id("tenant id", tenant_id)
        return await self._run(self._file.state, tenant_id, check_id("batch id", batch_id), self._clock())

    async def queued_items(self, tenant_id: str) -> tuple[int, int]:
        return await self._run(self._file.queued_items, check_id("tenant id", tenant_id))

    async def depth(self) -> tuple[int, int]:
        return await self._run(self._file.depth, self._clock())

    async def expire(self) -> int:
        return await self._run(self._file.expire, self._clock())

    async def aclose(self) -> None:
        await self._worker.run(self._file.conn.close)
        self._worker.close()
