"""Per-tenant concurrency: at most N requests of one tenant in flight at once, over all replicas.

One tenant must not take every backend connection of a gateway (`backend_max_connections`) and
starve the others. A request takes one of its tenant's slots as part of its admission
(gateway/pipeline/ticket.py: atomic across replicas in the store; a crashed replica's slots lapse
after `inflight_lease_s`) or is refused with 429 / 3040 and Retry-After, before any backend work is
done for it; the slot is given back when the request is settled. The limit is the tenant's own
`max_concurrent_requests`, else the gateway's `tenant_max_concurrent_requests` (None: no limit).
"""

from __future__ import annotations

from gateway.errors import ConcurrencyLimited
from gateway.store.models import Tenant

RETRY_AFTER_S = 1.0  # streams end at any moment: a short, honest hint


class TenantSlots:
    def __init__(self, default_limit: int | None) -> None:
        self.default_limit = default_limit

    def limit(self, tenant: Tenant) -> int | None:
        """The tenant's limit; None: no slot is taken."""
        return tenant.max_concurrent_requests or self.default_limit

    def refused(self, tenant: Tenant) -> ConcurrencyLimited:
        limit = self.limit(tenant)
        plural = "request" if limit == 1 else "requests"
        return ConcurrencyLimited(
            f"Too many requests in flight: this account allows {limit} concurrent {plural}; "
            "retry when one has finished",
            retry_after_s=RETRY_AFTER_S,
        )
