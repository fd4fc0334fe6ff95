"""How many dashboard usage queries one tenant may run at once in this gateway process.

A usage query reads every ledger record of its range, so a tenant looping long ranges would take
the store (and the event loop's turns) from everyone else. Its calls already count against the
key's requests per minute (`Authenticator.admit_key_request`); this caps how many run at once:
at most `max_per_tenant` per tenant, the next one is refused with 429 / 3040 and `Retry-After`
at once, never queued. The count is this process's own (each gateway replica or worker caps
separately). The admin's queries are not capped: the operator owns the gateway.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

from gateway.errors import ConcurrencyLimited

RETRY_AFTER_S = 1.0


class TenantQueries:
    def __init__(self, max_per_tenant: int) -> None:
        if max_per_tenant < 1:
            raise ValueError("max_per_tenant must be >= 1")
        self.max_per_tenant = max_per_tenant
        self._running: Counter[str] = Counter()

    def running(self, tenant_id: str) -> int:
        return self._running[tenant_id]

    @contextlib.contextmanager
    def slot(self, tenant_id: str) -> Iterator[None]:
        """Hold one of the tenant's query slots while the block runs, or raise ConcurrencyLimited."""
        if self._running[tenant_id] >= self.max_per_tenant:
            raise ConcurrencyLimited(
                f"tenant {tenant_id!r} already has {self._running[tenant_id]} dashboard queries running, the most "
                f"one tenant may (dashboard_max_concurrent_queries): retry once they have answered",
                retry_after_s=RETRY_AFTER_S,
            )
        self._running[tenant_id] += 1
        try:
            yield
        finally:
            self._running[tenant_id] -= 1
            if not self._running[tenant_id]:
                del self._running[tenant_id]
