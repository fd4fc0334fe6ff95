"""Per-tenant concurrency: at most N requests of one tenant in flight at once, over all replicas.

One tenant must not take every backend connection of a gateway (`backend_max_connections`) and
starve the others. `TenantSlots.acquire` takes a slot for the request in the shared store (atomic
across replicas; a crashed replica's slots lapse after `inflight_lease_s`) or refuses with
429 / 3040 and Retry-After, before any work is done for the request. The `Slot` it returns is
given back when the request ends (`release` is idempotent). The limit is the tenant's own
`max_concurrent_requests`, else the gateway's `tenant_max_concurrent_requests` (None: no limit).
"""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from gateway.errors import ConcurrencyLimited
from gateway.store.base import Store
from gateway.store.models import Tenant

log = structlog.get_logger("edgerun.gateway.concurrency")
RETRY_AFTER_S = 1.0  # streams end at any moment: a short, honest hint


@dataclass(slots=True)
class Slot:
    store: Store
    tenant_id: str
    request_id: str
    released: bool = False

    async def release(self) -> None:
        """Give the slot back (once; a store outage is logged: the lease frees it later)."""
        if self.released:
            return
        self.released = True
        try:  # called as one of a request's holds, whose settling runs to its end (gateway.pipeline.holds)
            await self.store.release_request_slot(self.tenant_id, self.request_id)
        except Exception as exc:
            log.warning("releasing a request slot failed", request_id=self.request_id, error=repr(exc))


class TenantSlots:
    def __init__(self, store: Store, default_limit: int | None) -> None:
        self.store = store
        self.default_limit = default_limit

    def limit(self, tenant: Tenant) -> int | None:
        return tenant.max_concurrent_requests or self.default_limit

    async def acquire(self, tenant: Tenant, request_id: str) -> Slot | None:
        """A slot for the request, None when the tenant has no limit; raises ConcurrencyLimited."""
        limit = self.limit(tenant)
        if limit is None:
            return None
        if not await self.store.acquire_request_slot(tenant.id, request_id, limit):
            plural = "request" if limit == 1 else "requests"
            raise ConcurrencyLimited(
                f"Too many requests in flight: this account allows {limit} concurrent {plural}; "
                "retry when one has finished",
                retry_after_s=RETRY_AFTER_S,
            )
        return Slot(self.store, tenant.id, request_id)
