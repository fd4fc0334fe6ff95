"""`MemoryAdmission`: the one-process store's admission, decided in this process's memory.

Rate-limit windows and concurrency slots live in memory only: after a restart they start empty,
which costs at most one minute of rate-limit history. Monthly spends are decided in memory and
saved to the SQLite file (budgets.py); in-flight tokens are the routing state's (routing.py). Each
check-and-change completes without awaiting, so it is atomic on the event loop; `settle` awaits
only its ledger record, after every release is done.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.store.admission import Admitted, Claim, Release, check_release_record
from gateway.store.checks import check_month
from gateway.store.limits import ALLOWED, WINDOW_MS, limits_apply, refused, to_ms
from gateway.store.local.budgets import BudgetBook
from gateway.store.local.ledger import LocalLedger
from gateway.store.local.routing import MemoryRouting
from gateway.store.local.tables import WindowCounters
from gateway.store.models import LimitDecision, UsageRecord
from policies.limits import WindowRule, sliding_window


class MemoryAdmission:
    admits_at_once = True  # every check-and-change completes without awaiting

    def __init__(
        self, budgets: BudgetBook, routing: MemoryRouting, ledger: LocalLedger, clock: Callable[[], float] = time.time
    ) -> None:
        self._budgets = budgets
        self._routing = routing
        self._ledger = ledger
        self._clock = clock
        self._windows = WindowCounters(WINDOW_MS)
        self._slots: dict[str, set[str]] = {}  # tenant -> request ids in flight

    def _retry_ms(self, scope: str, limit: int, cost: int, now_ms: int) -> int | None:
        """None when `cost` fits the window now, else the ms until it would."""
        prev, current = self._windows.counts(scope, now_ms)
        decision = sliding_window(prev, current, cost, WindowRule(limit, WINDOW_MS), now_ms)
        return None if decision.allowed else decision.retry_after_ms

    async def check_and_consume(
        self, key_id: str, rpm: int | None, tpm: int | None, tokens_estimate: int, now: float | None = None
    ) -> LimitDecision:
        if not limits_apply(key_id, rpm, tpm, tokens_estimate):
            return ALLOWED
        now_ms = to_ms(self._clock() if now is None else now)
        rpm_retry = None if rpm is None else self._retry_ms(f"{key_id}:rpm", rpm, 1, now_ms)
        tpm_retry = None if tpm is None else self._retry_ms(f"{key_id}:tpm", tpm, tokens_estimate, now_ms)
        if rpm_retry is not None or tpm_retry is not None:
            return refused(rpm_retry, tpm_retry)
        if rpm is not None:
            self._windows.add(f"{key_id}:rpm", now_ms, 1)
        if tpm is not None:
            self._windows.add(f"{key_id}:tpm", now_ms, tokens_estimate)
        return ALLOWED

    async def admit(self, claim: Claim, now: float | None = None) -> Admitted:
        held = self._slots.get(claim.tenant_id)
        if claim.slot_limit is not None and held is not None and claim.request_id not in held \
                and len(held) >= claim.slot_limit:
            return Admitted(False, "slot")
        now_ms = 0
        if claim.tpm is not None:
            assert claim.key_id is not None
            now_ms = to_ms(self._clock() if now is None else now)
            retry = self._retry_ms(f"{claim.key_id}:tpm", claim.tpm, claim.tokens, now_ms)
            if retry is not None:
                return Admitted(False, "tpm", retry_after_s=retry / 1000)
        spent = 0
        if claim.month is not None:
            spent = self._budgets.spent(claim.tenant_id, claim.month)
            if claim.budget_micro is not None and spent + claim.amount_micro > claim.budget_micro:
                return Admitted(False, "budget", spent_micro=spent)
            spent += claim.amount_micro
            self._budgets.set(claim.tenant_id, claim.month, spent)  # first: it alone may raise (64-bit overflow)
        if claim.slot_limit is not None:
            self._slots.setdefault(claim.tenant_id, set()).add(claim.request_id)
        if claim.tpm is not None:
            self._windows.add(f"{claim.key_id}:tpm", now_ms, claim.tokens)
        if claim.inflight is not None:
            self._routing.change(claim.inflight, sign=1)
        return Admitted(True, spent_micro=spent)

    async def settle(self, release: Release, record: UsageRecord | None = None, now: float | None = None) -> bool | None:
        check_release_record(release, record)
        if release.slot:
            held = self._slots.get(release.tenant_id)
            if held is not None:
                held.discard(release.request_id)
                if not held:
                    del self._slots[release.tenant_id]
        if release.tokens_delta:
            self._windows.add(f"{release.key_id}:tpm", to_ms(self._clock() if now is None else now),
                              release.tokens_delta)
        if release.month is not None:
            spent = self._budgets.spent(release.tenant_id, release.month)
            self._budgets.set(release.tenant_id, release.month,
                              max(0, spent + release.cost_micro - release.reserved_micro))
        if release.inflight is not None:
            self._routing.change(release.inflight, sign=-1)
        return None if record is None else await self._ledger.append(record)

    async def budget_spent(self, tenant_id: str, month: str) -> int:
        return self._budgets.spent(tenant_id, check_month(month))
