"""The local store: one machine, no server. Memory plus one SQLite file for what must survive a restart.

    file.py           the SQLite file and its one worker thread (writes on the loop when they can)
    database.py       the file's tables and SQL: tenants, key hashes, budgets, the ledger and its hourly sums
    serial_worker.py  the thread that runs SQLite calls in order, grouping writes into one transaction
    tables.py         the in-memory tables: TTL map, prefix table, rate-limit windows
    tenancy.py        LocalTenancy: tenants and keys cached in memory, written through
    budgets.py        BudgetBook: monthly spends in memory, saved with the next ledger transaction
    admission.py      MemoryAdmission: windows and slots in memory, budgets in the BudgetBook
    routing.py        MemoryRouting: sessions, prefix index and in-flight tokens in memory
    ledger.py         LocalLedger: group-committed appends, reads, hourly sums
    queue.py          LocalQueue: batch items under leases in the file, on their own connection and thread
    shared_tables.py  the shared mode's tables and SQL (several processes on one file)
    shared.py         SharedAdmission, SharedRouting and this process's lease on them
    file_claim.py     one process per file, unless all share it
    cache.py          MemoryCache: the response cache, an LRU in memory with a byte cap
    adapters.py       LocalAdapters: tenants' LoRA finetunes (metadata) in the file's own table

`open_local(settings, savings)`: one process keeps admission and routing state in its memory; with
`sqlite_shared` (several processes on the file: `serve --workers N` without Redis) they live in the
file's shared tables instead. Tenancy and the ledger are the file's either way; the response cache
is each process's memory either way.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gateway.store.checks import check_id
from gateway.store.factory import Store
from gateway.store.lease import default_replica_id
from gateway.store.ledger import Savings, savings_or_zero
from gateway.store.local.adapters import LocalAdapters
from gateway.store.local.admission import MemoryAdmission
from gateway.store.local.budgets import BudgetBook
from gateway.store.local.cache import MemoryCache
from gateway.store.local.file import LocalFile
from gateway.store.local.ledger import LocalLedger
from gateway.store.local.queue import LocalQueue
from gateway.store.local.routing import MemoryRouting
from gateway.store.local.shared import SharedAdmission, SharedLease, SharedRouting
from gateway.store.local.tenancy import LocalTenancy
from gateway.store.settings import StoreSettings


def open_local(settings: StoreSettings, savings: Savings, clock: Callable[[], float] = time.time) -> Store:
    """The local store on `settings.sqlite_path` (created if needed); `clock` stamps times (tests)."""
    shared = settings.sqlite_shared
    closed = threading.Event()  # (set once: closing twice does nothing)
    file = LocalFile(settings, writes_on_loop=not shared)
    queue = LocalQueue(settings, clock)
    tenancy = LocalTenancy(file, 0.0 if shared else settings.sqlite_refresh_s, clock)
    if shared:
        lease = SharedLease(file, settings, check_id("replica id", settings.replica_id or default_replica_id()))
        ledger = LocalLedger(file, savings, write_batch=lambda records, saved: lease.run(
            lease.tables.insert_usages, records, saved))

        async def close_shared() -> None:
            if not closed.is_set():
                closed.set()
                await tenancy.close()
                await ledger.close()
                await lease.aclose()
                await file.aclose()
                await queue.aclose()

        return Store(tenancy, SharedAdmission(lease, savings_or_zero(savings), clock), SharedRouting(lease), ledger,
                     MemoryCache(settings), queue, close_shared,
                     adapters=LocalAdapters(file))
    budgets = BudgetBook(file)
    ledger = LocalLedger(file, savings, budgets)
    routing = MemoryRouting(settings)

    async def close() -> None:
        if not closed.is_set():
            closed.set()
            await tenancy.close()
            await ledger.close()  # what was queued is committed before the file closes
            await budgets.aclose()
            await file.aclose()
            await queue.aclose()  # (its own connection and thread)

    return Store(tenancy, MemoryAdmission(budgets, routing, ledger, clock), routing, ledger, MemoryCache(settings), queue,
                 close, adapters=LocalAdapters(file))
