"""`LocalFile`: the local store's SQLite file and the one thread that works on it.

Every SQLite call runs in call order on the file's worker thread (serial_worker.py), with one
exception in the one-process store: the writes every request makes (its ledger record, with the
budget spends, and budget spends on their own) run on the event loop itself when the worker has
nothing queued or running, on a second connection that never waits for a lock (`busy_timeout` 0)
and never checkpoints. Such a write (WAL, `synchronous=NORMAL`: the commit appends to the WAL and
syncs nothing) takes tens of microseconds; handing it to the thread cost several times that in GIL
hand-offs between the two threads (measured, BENCHMARKS.md "Gateway CPU per streamed request"). A
write that finds the file locked (another process writing), or fails for any other reason, goes to
the worker instead, which waits `sqlite_busy_timeout_s` or reports the error; so does any write
while the worker is busy, so writes never overtake each other. Every `CHECKPOINT_EVERY` such writes
(on the loop or not), the worker checkpoints the WAL (PASSIVE), which may sync the file: never on
the loop; nor is the first write after it, which starts the WAL over and syncs its header (so no
connection of the store checkpoints of itself).

In the file's shared mode (several processes, local/shared.py) every write joins the worker's
group transaction instead (`run_grouped`), and nothing runs on the loop.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from gateway.store.errors import StoreUnavailable
from gateway.store.local.database import Database
from gateway.store.local.serial_worker import SerialWorker
from gateway.store.settings import StoreSettings

T = TypeVar("T")
log = structlog.get_logger("edgerun.gateway.store")
CHECKPOINT_EVERY = 256  # a request's writes between two WAL checkpoints on the worker (a few pages each)


class LocalFile:
    def __init__(self, settings: StoreSettings, *, writes_on_loop: bool) -> None:
        """Open (creating if needed) `settings.sqlite_path`; `writes_on_loop`: the one-process fast path above."""
        on_loop = writes_on_loop and settings.sqlite_path != ":memory:"  # (a second connection: another database)
        # With writes on the loop, only the store checkpoints (`write`): the worker's connection would
        # do it after a commit past 1000 WAL pages, and the WAL would then start over on the loop.
        self.db = Database(settings.sqlite_path, busy_timeout_s=settings.sqlite_busy_timeout_s, autocheckpoint=not on_loop)
        self.worker = SerialWorker("edgerun-sqlite")
        self.is_file = settings.sqlite_path != ":memory:"  # nobody else can write to a memory database
        self._db_on_loop: Database | None = None
        if on_loop:
            self._db_on_loop = Database(settings.sqlite_path, busy_timeout_s=settings.sqlite_busy_timeout_s,
                                        autocheckpoint=False)
            self._db_on_loop.never_wait()
        self._writes = 0  # by `write`, on the loop or the worker
        self._checkpointing: asyncio.Task[None] | None = None
        self._wal_may_restart = False  # until a write after the last checkpoint went through the worker
        self._closed = False

    async def run(self, fn: Callable[..., T], *args: object, grouped: bool = False) -> T:
        """`fn(*args)` on the worker thread (`grouped`: `SerialWorker.run_grouped`); a file error is StoreUnavailable."""
        try:
            return await (self.worker.run_grouped if grouped else self.worker.run)(fn, *args)
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, disk full, file gone
            raise StoreUnavailable(f"the SQLite file cannot be written ({exc}); check EDGERUN_SQLITE_PATH") from exc

    async def write(self, name: str, *args: object) -> Any:
        """`Database.<name>(*args)`: on the event loop when it can go at once (see the module's doc),
        else on the worker."""
        here = self._db_on_loop
        if here is None:
            return await self.run(getattr(self.db, name), *args)
        self._writes += 1
        if self._writes % CHECKPOINT_EVERY == 0 and self._checkpointing is None and not self._closed:
            self._wal_may_restart = True
            self._checkpointing = asyncio.get_running_loop().create_task(self._checkpoint())
        # After a complete checkpoint the next write starts the WAL over and syncs its header
        # (fdatasync, synchronous=NORMAL or not): that write goes to the worker too.
        if not self._wal_may_restart and self.worker.is_idle:
            try:
                return getattr(here, name)(*args)
            except sqlite3.Error:  # locked by another process, or a file error: the worker waits or reports it
                pass
        follows_checkpoint = self._wal_may_restart and self._checkpointing is None  # queued behind it
        result = await self.run(getattr(self.db, name), *args)
        if follows_checkpoint:
            self._wal_may_restart = False
        return result

    async def _checkpoint(self) -> None:
        try:
            await self.run(self.db.checkpoint)
        except (StoreUnavailable, sqlite3.Error) as exc:  # the next one tries again; the WAL only grows meanwhile
            log.warning("checkpointing the SQLite WAL failed", error=str(exc))
        finally:
            self._checkpointing = None

    async def aclose(self) -> None:
        """Close the file, after the checkpoint under way (the owners have written what they hold)."""
        if self._closed:
            return
        self._closed = True
        if self._checkpointing is not None:
            await asyncio.wait({self._checkpointing})
        if self._db_on_loop is not None:
            self._db_on_loop.close()
        await self.run(self.db.close)
        self.worker.close()
