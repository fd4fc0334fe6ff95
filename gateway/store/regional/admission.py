"""`LeasedAdmission`: the regional store's admission, a tenant's budget checked against what this
region has leased from home (leases.py) rather than against the whole budget.

Everything else is the region's own: the per-key windows (requests and tokens per minute) and the
tenant's concurrency slots count the requests of this region only, so a key's limits apply in each
region separately (README, "Deploying in several regions"); budgets alone are global.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.store.admission import Admission, Admitted, Claim, Release
from gateway.store.models import LimitDecision, UsageRecord
from gateway.store.regional.leases import BudgetLeases


class LeasedAdmission:
    admits_at_once = False

    def __init__(self, regional: Admission, leases: BudgetLeases) -> None:
        self._regional = regional
        self._leases = leases

    async def check_and_consume(
        self, key_id: str, rpm: int | None, tpm: int | None, tokens_estimate: int, now: float | None = None
    ) -> LimitDecision:
        return await self._regional.check_and_consume(key_id, rpm, tpm, tokens_estimate, now)

    async def admit(self, claim: Claim, now: float | None = None) -> Admitted:
        if claim.month is None or claim.budget_micro is None:
            return await self._regional.admit(claim, now)
        lease = await self._leases.lease(claim.tenant_id, claim.month, claim.budget_micro)
        decision = await self._regional.admit(replace(claim, budget_micro=lease.granted_micro), now)
        if decision.refused == "budget" and await self._leases.take(claim.tenant_id, claim.month, claim.amount_micro):
            # spent faster than the background renewed it: the lease just taken may fit the request
            decision = await self._regional.admit(replace(claim, budget_micro=lease.granted_micro), now)
        if decision.allowed:
            self._leases.spent(lease, decision.spent_micro)
        return decision

    async def settle(self, release: Release, record: UsageRecord | None = None, now: float | None = None) -> bool | None:
        return await self._regional.settle(release, record, now)

    async def budget_spent(self, tenant_id: str, month: str) -> int:
        """This region's spend."""
        return await self._regional.budget_spent(tenant_id, month)
