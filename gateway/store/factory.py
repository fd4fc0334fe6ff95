"""`open_store`: one backend for each concern of the store, chosen from the settings.

One region of several when `settings.home_redis_url` is set (regional/: this region's Redis, a
replica of the home region's tenancy, the home region's record); else Redis when `settings.redis_url`
is set (several replicas, on one machine or many); else the local
store on `settings.sqlite_path`: memory plus the SQLite file for one process, the file's shared
tables for several (`sqlite_shared`, which `serve --workers N` sets for its workers).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from gateway.store.adapters import Adapters
from gateway.store.admission import Admission
from gateway.store.cache import Cache
from gateway.store.ledger import Ledger, Savings, no_savings
from gateway.store.queue import BatchQueue
from gateway.store.routing import RoutingState
from gateway.store.settings import StoreSettings
from gateway.store.tenancy import Tenancy


@dataclass(frozen=True, slots=True)
class Store:
    """The gateway's shared state, one part per concern (each part's module says what it keeps)."""

    tenancy: Tenancy
    admission: Admission
    routing: RoutingState
    ledger: Ledger
    cache: Cache
    queue: BatchQueue
    _close: Callable[[], Awaitable[None]]
    # Loops the app's lifespan runs as tasks and cancels at its end (a region's ledger shipping and budget leases).
    background: tuple[Callable[[], Coroutine[Any, Any, None]], ...] = ()
    # What /healthz shows of the store beyond its answers (a region: its tenancy copy's link to home,
    # the ledger records not yet shipped); None: nothing.
    health: Callable[[], Awaitable[dict[str, Any]]] | None = None
    adapters: Adapters = field(kw_only=True)

    async def aclose(self) -> None:
        """Release connections, files and background tasks (what was queued is written first); this
        replica's slots and in-flight counts are dropped."""
        await self._close()


def open_store(settings: StoreSettings, savings: Savings = no_savings) -> Store:
    """The store the settings ask for. `savings` prices what a ledger record's cached tokens saved,
    for the ledger's hourly sums (gateway/billing/savings.py); a process that writes no records
    (the CLI's tenant and key commands) may leave it out.

    Call it inside the app's lifespan and `await store.aclose()` when it ends. Redis is connected on
    first use, so a wrong URL shows up as StoreUnavailable on the first call.
    """
    if settings.home_redis_url:
        from gateway.store.regional import open_regional

        return open_regional(settings, savings)
    if settings.redis_url:
        from gateway.store.redis import open_redis

        return open_redis(settings, savings)
    from gateway.store.local import open_local

    return open_local(settings, savings)
