"""The durable archive of the Redis store's ledger: a SQLite file in the local store's schema.

Redis holds the recent ledger in memory; `RedisLedger.archive` copies older records here, each
batch committed with `synchronous=FULL` (it survives an OS crash) before Redis forgets them. The
file has the local store's tables, so it can be exported on its own too:
`EDGERUN_SQLITE_PATH=<archive> EDGERUN_REDIS_URL= edgerun billing export ...`.
All SQLite work runs, in call order, on one worker thread owned by the archive.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from gateway.store.errors import StoreUnavailable
from gateway.store.local.database import Database
from gateway.store.models import UsageRecord, to_us

T = TypeVar("T")


class LedgerArchive:
    def __init__(self, path: str) -> None:
        """Open (creating if needed) the archive at `path`; `id` names the file (see `Database.identity`)."""
        self._db = Database(path, synchronous="FULL")
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgerun-ledger-archive")
        self.path = path
        self.id = self._db.identity()

    async def _run(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)
        except sqlite3.OperationalError as exc:
            message = f"the ledger archive {self.path} cannot be used ({exc}); check EDGERUN_LEDGER_ARCHIVE_PATH"
            raise StoreUnavailable(message) from exc

    async def insert(self, records: Sequence[UsageRecord], savings: Sequence[int]) -> None:
        """Commit the records, with their hourly sums (those already here are left as they are: the
        archive is idempotent too)."""
        if records:
            await self._run(self._db.insert_usages, list(records), list(savings))

    async def iter_usage(self, start: float, end: float, tenant_id: str | None) -> AsyncIterator[UsageRecord]:
        """As `Ledger.iter_usage`: by (ended_us, request_id), in pages."""
        async for record in self._db.iter_usage(self._run, to_us(start), to_us(end), tenant_id):
            yield record

    async def get_usage(self, request_id: str) -> UsageRecord | None:
        return await self._run(self._db.get_usage, request_id)

    async def aclose(self) -> None:
        await self._run(self._db.close)
        self._worker.shutdown(wait=True)
