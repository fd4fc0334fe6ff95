"""The gateway's shared state: tenants, keys, limits, budgets, sessions, prefix index, in-flight counts, ledger.

`open_store(settings)` returns a `Store` (see `base.py` for the contract); the data types are in
`models.py` and the errors in `errors.py`.

    base.py            the contract every gateway module codes against
    models.py          what the store keeps: plain dataclasses
    errors.py          the store's errors (sqlite3 and redis converted at its edge)
    settings.py        the `[store]` section
    factory.py         the store the settings ask for
    checks.py          argument checks both stores share
    apikeys.py         API key secrets, stored only as SHA-256 hashes
    limits.py          glue to `policies.limits`
    lease.py           a store's lease-renewal loop
    embedded.py        one gateway process, no server (the default)
    memory.py          the embedded store's in-memory tables
    sqlite_db.py       its SQLite file: what survives a restart
    serial_worker.py   one thread running its blocking SQLite calls in order
    embedded_shared.py the embedded store shared by several processes on one machine
    sqlite_shared.py   the counters they share through one SQLite file
    host/              the store host: one process keeping the store for a machine's gateway workers
    redis_store.py     several gateway replicas (`EDGERUN_REDIS_URL`)
    redis_codec.py     its key names and hash encodings
    redis_scripts.py   its Lua scripts, one per check-and-change
    redis_pool.py      its bounded connection pool
    redis_ledger.py    its ledger stream, time indexes and retention
    redis_undo.py      taking back budget reservations whose outcome was never learnt
    archive.py         the durable SQLite archive of its ledger
"""

from __future__ import annotations

from gateway.store.base import Store
from gateway.store.errors import Conflict, InvalidArgument, NotFound, StoreError, StoreUnavailable, TokensOverLimit
from gateway.store.factory import open_store
from gateway.store.models import ApiKey, BudgetDecision, LimitDecision, Tenant, UsageRecord

__all__ = [
    "ApiKey",
    "BudgetDecision",
    "Conflict",
    "InvalidArgument",
    "LimitDecision",
    "NotFound",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "Tenant",
    "TokensOverLimit",
    "UsageRecord",
    "open_store",
]
