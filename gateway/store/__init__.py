"""The gateway's shared state, one small contract per concern, each with a local and a Redis backend.

    tenancy.py    Tenancy: tenants, API keys (as hashes), revocation, server-side secrets
    admission.py  Admission: rate windows, budgets, concurrency slots; a request's one admit and one settle
    routing.py    RoutingState: sessions, the prefix index, in-flight tokens per backend
    ledger.py     Ledger: usage records (exactly once per request id), ranges, hourly sums
    cache.py      Cache: answers kept per tenant for a TTL (the opt-in response cache), size-capped
    queue.py      BatchQueue: asynchronous batch items under leases, and their answers for a while
    factory.py    open_store(settings) -> Store (the seven, from one backend)
    adapters.py   Adapters: tenants' LoRA finetunes (metadata; the files are the gateway's adapter directory)
    local/        one machine: memory plus the SQLite file (and the file's shared mode for several processes)
    redis/        several replicas on one Redis
    regional/     one region of several: tenancy replicated from home, budgets leased, the ledger shipped home
    models.py     the plain data the concerns keep (Tenant, ApiKey, UsageRecord, decisions)
    errors.py     what the store raises (everything else is converted at its edge)
    checks.py     argument checks shared by the backends, so both refuse the same inputs alike
    limits.py     glue to `policies.limits` (sliding-window arithmetic)
    lease.py      replica ids and the lease-renewal task
    apikeys.py    API key secrets and their hashes
    settings.py   the `[store]` settings section

A streamed request makes at most seven calls, each one round trip on Redis: `tenancy.authenticate`,
`admission.check_and_consume` (requests per minute, on arrival), `routing.lookup`,
`admission.admit`, `routing.started`, `routing.release_inflight` (its first token) and
`admission.settle` (which appends its ledger record). Rules that hold for every backend:
- every check-and-change is atomic across all replicas sharing the store (N replicas never allow
  N x a limit or a budget);
- every collection is bounded (size cap, TTL or both) except the ledger, which is the record of
  money and is only ever appended to (Redis moves old records to a durable archive rather than
  deleting them);
- bad arguments raise `InvalidArgument` (a ValueError) naming the argument; an unreachable Redis
  (or an unwritable SQLite file) raises `StoreUnavailable`; nothing else escapes.
"""

from __future__ import annotations

from gateway.store.admission import Admission, Admitted, Claim, Inflight, Release
from gateway.store.cache import Cache
from gateway.store.errors import Conflict, InvalidArgument, NotFound, StoreError, StoreUnavailable, TokensOverLimit
from gateway.store.factory import Store, open_store
from gateway.store.ledger import Ledger
from gateway.store.models import ApiKey, LimitDecision, Tenant, UsageRecord
from gateway.store.routing import RouteKey, RouteView, RoutingState
from gateway.store.tenancy import Tenancy

__all__ = [
    "Admission",
    "Admitted",
    "ApiKey",
    "Cache",
    "Claim",
    "Conflict",
    "Inflight",
    "InvalidArgument",
    "Ledger",
    "LimitDecision",
    "NotFound",
    "Release",
    "RouteKey",
    "RouteView",
    "RoutingState",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "Tenancy",
    "Tenant",
    "TokensOverLimit",
    "UsageRecord",
    "open_store",
]
