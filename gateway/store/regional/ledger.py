"""`HomeLedger`: records appended in the region, read at home.

A record is appended to the regional ledger (a request's `settle` does it in its one script, the
spool's replays through `append`), from where the shipper (shipper.py) carries it home; exports,
audits and the dashboard read the home region's ledger, which holds every region's records once.
A record is there once shipped: within the WAN's round trip in the steady state (BENCHMARKS.md,
"Several regions"), after the link returns when it was cut. Retention (`archive`) applies to the
regional ledger; the home ledger is archived where it is the region's own (the home region).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from gateway.store.ledger import Ledger, SummedHours
from gateway.store.models import UsageRecord


class HomeLedger:
    def __init__(self, regional: Ledger, home: Ledger) -> None:
        self._regional = regional
        self._home = home

    async def append(self, record: UsageRecord) -> bool:
        return await self._regional.append(record)

    def iter_usage(self, start: float, end: float, tenant_id: str | None = None) -> AsyncIterator[UsageRecord]:
        return self._home.iter_usage(start, end, tenant_id)

    async def get(self, request_id: str) -> UsageRecord | None:
        return await self._home.get(request_id)

    async def hours(self, start_hour: int, end_hour: int, tenant_id: str | None = None) -> SummedHours:
        return await self._home.hours(start_hour, end_hour, tenant_id)

    async def archive(self, older_than: float) -> int:
        return await self._regional.archive(older_than)
