"""The Redis store: shared state for several gateway replicas, on one machine or many (`EDGERUN_REDIS_URL`).

    connection.py  the client every concern shares, key names, scripts, this replica's lease
    pool.py        the bounded connection pool (a command waits for a free connection)
    keys.py        key names and hash encodings (the layout, in its docstring)
    scripts.py     the Lua scripts: every check-and-change, and each call of a request, is one
    tenancy.py     RedisTenancy: tenants, keys, secrets
    admission.py   RedisAdmission: windows, budgets, slots; admit and settle
    undo.py        takes back reservations whose caller never learnt their fate
    routing.py     RedisRouting: sessions, prefix index, in-flight tokens per replica
    ledger.py      RedisLedger: the stream, time indexes, hourly sums, retention
    queue.py       RedisQueue: batch items under leases, answers kept for a while
    archive.py     the ledger's durable archive (a SQLite file)
    cache.py       RedisCache: the response cache (SET PX, and a total bound kept by one script)
    adapters.py    RedisAdapters: tenants' LoRA finetunes (metadata)

Every request's call is one round trip: one script (`authenticate`, `check_and_consume`, `lookup`,
`admit`, `started`, `settle` with the ledger record, the first token's `release_inflight`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.store.factory import Store
from gateway.store.ledger import Savings
from gateway.store.redis.adapters import RedisAdapters
from gateway.store.redis.admission import RedisAdmission
from gateway.store.redis.cache import RedisCache
from gateway.store.redis.connection import RedisConnection
from gateway.store.redis.ledger import RedisLedger
from gateway.store.redis.queue import RedisQueue
from gateway.store.redis.routing import RedisRouting
from gateway.store.redis.tenancy import RedisTenancy
from gateway.store.settings import StoreSettings


def open_redis(settings: StoreSettings, savings: Savings, clock: Callable[[], float] = time.time) -> Store:
    """The Redis store on `settings.redis_url` (connected on first use); `clock` stamps times (tests)."""
    return redis_store(RedisConnection(settings), savings, clock)


def redis_store(connection: RedisConnection, savings: Savings, clock: Callable[[], float] = time.time) -> Store:
    """The Redis store on `connection` (closed with it)."""
    ledger = RedisLedger(connection, savings)
    admission = RedisAdmission(connection, ledger)
    queue = RedisQueue(connection.settings)
    closed = False

    async def close() -> None:
        nonlocal closed
        if closed:
            return
        closed = True
        await admission.aclose()  # its undos, before the connections go
        await ledger.aclose()
        await queue.aclose()
        await connection.aclose()

    return Store(RedisTenancy(connection, clock), admission, RedisRouting(connection, clock), ledger,
                 RedisCache(connection), queue, close, adapters=RedisAdapters(connection))
