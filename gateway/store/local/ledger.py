"""`LocalLedger`: the ledger in the SQLite file (`usage` rows, keyed by request id, and their hourly sums).

Appends are group-committed: records that arrive while a ledger transaction is being written go
into the next one together (one commit for many requests under load), and each `append` returns
once its own record is committed. The transaction also carries the monthly spends not yet saved
(the one-process store's `BudgetBook`), or, in the file's shared mode, joins the worker's group
transaction with every other shared-table write (`SharedTables.insert_usages`). A batch that fails
for another reason than the file (which fails them all alike) is written again one record at a
time, so one bad record fails alone. A file from before the hourly sums existed gets them built
once, when the ledger opens.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.store.checks import check_id
from gateway.store.errors import StoreUnavailable
from gateway.store.ledger import Savings, SummedHours, savings_or_zero
from gateway.store.local.budgets import BudgetBook
from gateway.store.local.file import LocalFile
from gateway.store.models import UsageRecord, to_us

WriteBatch = Callable[[list[UsageRecord], list[int]], Awaitable[list[bool]]]


class LocalLedger:
    def __init__(self, file: LocalFile, savings: Savings, budgets: BudgetBook | None = None,
                 write_batch: WriteBatch | None = None) -> None:
        """`budgets`: spends that go with each transaction (one process); `write_batch`: how a batch is
        written instead (the shared mode)."""
        self._file = file
        self._savings = savings_or_zero(savings)
        self._budgets = budgets
        self._write_batch = write_batch or self._write_with_budgets
        self._queue: list[tuple[UsageRecord, asyncio.Future[bool]]] = []
        self._writer: asyncio.Task[None] | None = None  # runs while the queue has records
        file.db.build_hours(self._savings)

    async def append(self, record: UsageRecord) -> bool:
        if not isinstance(record, UsageRecord):
            raise TypeError(f"append takes a UsageRecord, got {type(record).__name__}")
        written: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.append((record, written))
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_queued(), name="edgerun-ledger-writer")
        return await written  # a cancelled caller's record is still written

    async def _write_queued(self) -> None:
        """Commit queued records, one transaction per batch, until the queue is empty."""
        batch: list[tuple[UsageRecord, asyncio.Future[bool]]] = []
        try:
            while self._queue:
                batch, self._queue = self._queue, []
                outcomes = await self._insert([record for record, _ in batch])
                for (_, written), outcome in zip(batch, outcomes):
                    if written.done():
                        continue
                    if isinstance(outcome, BaseException):
                        written.set_exception(outcome)
                    else:
                        written.set_result(outcome)
        except asyncio.CancelledError:  # the loop is going away: nothing is known to be committed
            for _, written in [*batch, *self._queue]:
                if not written.done():
                    written.set_exception(StoreUnavailable("the ledger writer was stopped"))
            self._queue = []
            raise
        finally:
            self._writer = None

    async def _write_with_budgets(self, records: list[UsageRecord], savings: list[int]) -> list[bool]:
        """One transaction of ledger records and of the spends not yet written."""
        budgets = self._budgets.take_unsaved() if self._budgets is not None else {}
        try:
            written: list[bool] = await self._file.write("insert_usages", records, savings, budgets)
        except BaseException:
            if self._budgets is not None:
                self._budgets.give_back(budgets)
            raise
        if self._budgets is not None:
            self._budgets.writes_work()
        return written

    async def _insert(self, records: list[UsageRecord]) -> list[bool | BaseException]:
        """Each record's outcome (see the module's doc)."""
        try:
            return list(await self._write_batch(records, [self._savings(r) for r in records]))
        except StoreUnavailable as exc:
            return [exc] * len(records)
        except Exception as exc:
            if len(records) == 1:
                return [exc]
        outcomes: list[bool | BaseException] = []
        for record in records:
            outcomes.extend(await self._insert([record]))
        return outcomes

    async def iter_usage(self, start: float, end: float, tenant_id: str | None = None) -> AsyncIterator[UsageRecord]:
        if tenant_id is not None:
            check_id("tenant id", tenant_id)
        async for record in self._file.db.iter_usage(self._file.run, to_us(start), to_us(end), tenant_id):
            yield record

    async def get(self, request_id: str) -> UsageRecord | None:
        return await self._file.run(self._file.db.get_usage, request_id)

    async def hours(self, start_hour: int, end_hour: int, tenant_id: str | None = None) -> SummedHours:
        if tenant_id is not None:
            check_id("tenant id", tenant_id)
        return SummedHours(0, await self._file.run(self._file.db.usage_hours, start_hour, end_hour, tenant_id))

    async def archive(self, older_than: float) -> int:
        return 0  # on disk already

    async def close(self) -> None:
        """What was queued is committed before the file closes."""
        if self._writer is not None:
            await asyncio.wait({self._writer})
