"""Metering: what a request may spend before it runs, and the one ledger record after it ran.

Before routing, `reserve` prices the worst case (every prompt token uncached, all of
max_tokens generated) and reserves it against the tenant's monthly budget (refused: 429 / 3036).
After a request that reached a backend, `settle` builds a `UsageRecord` from the final usage
(prompt, cached, completion tokens), prices it with `policies.pricing` (cached input at its
discounted rate, integer micro-units), appends it to the ledger keyed by the request id (the
store makes that exactly-once), and replaces the budget reservation with the real cost.

A model without a configured price is metered at cost 0 with price version "unpriced" (the
tokens are still recorded). Which tokens are billed for each status is `billing.rules`' one rule
(a backend failure or refusal costs nothing). A record the ledger cannot take (the store is
down) goes to the local spool (`billing.spool`) and is replayed later; a budget that cannot be
settled is logged and left reserved (the tenant is never under-charged), never losing the record.
A reservation whose caller left while it was in flight is given back once it lands; `aclose` (the
app's lifespan, before the store closes) waits for those.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import structlog

from contracts.usage import Usage
from gateway.billing.rules import billable_usage
from gateway.billing.spool import LedgerSpool
from gateway.context import RequestContext
from gateway.errors import BudgetExhausted
from gateway.metrics import GatewayMetrics
from gateway.store.base import Store
from gateway.store.errors import InvalidArgument
from gateway.store.models import BudgetDecision, UsageRecord, UsageStatus
from policies.pricing import Price, PriceTable, cost_micros

log = structlog.get_logger("edgerun.gateway.metering")
UNPRICED = "unpriced"


@dataclass(slots=True)
class Reservation:
    month: str  # "YYYY-MM" (UTC) of the request's start
    amount_micro: int
    settled: bool = False


@dataclass(slots=True)
class MeteredRequest:
    """What metering adds to a request's context, filled in as it runs."""

    ctx: RequestContext  # who, which model, when: the record's identity
    prompt_tokens: int
    reservation: Reservation | None = None
    ttft_s: float | None = None  # arrival -> first generated text; None: no text was generated
    itl_s: float | None = None  # mean gap between generated tokens after the first


class Metering:
    def __init__(
        self, store: Store, prices: PriceTable, metrics: GatewayMetrics, spool: LedgerSpool | None = None
    ) -> None:
        self.store = store
        self.prices = prices
        self.metrics = metrics
        self.spool = spool  # None: a ledger failure raises (nothing to keep the record in)
        # reservations of callers that left, then their give-backs: kept alive here, awaited by `aclose`
        self.giving_back: set[asyncio.Future[Any]] = set()

    def price(self, model_id: str) -> Price | None:
        return self.prices.prices.get(model_id)

    def cost(self, model_id: str, usage: Usage) -> tuple[int, str]:
        price = self.price(model_id)
        if price is None:
            return 0, UNPRICED
        return cost_micros(usage, price), price.version

    async def reserve(self, request: MeteredRequest, max_tokens: int) -> None:
        """Reserve the worst-case cost against the tenant's monthly budget, or refuse the request."""
        worst = Usage(prompt_tokens=request.prompt_tokens, completion_tokens=max_tokens, cached_tokens=0)
        amount, _ = self.cost(request.ctx.model_id, worst)
        tenant = request.ctx.principal.tenant
        if amount == 0 and tenant.monthly_budget_micro is None:
            return
        month = time.strftime("%Y-%m", time.gmtime(request.ctx.arrived_at))
        reserving = asyncio.ensure_future(
            self.store.reserve_budget(tenant.id, month, amount, tenant.monthly_budget_micro)
        )
        try:
            decision = await asyncio.shield(reserving)
        except asyncio.CancelledError:
            # The caller left (client gone, shutdown) while the reservation was in flight: the store
            # still applies it, and nobody would settle it. Give it back once it lands.
            self.giving_back.add(reserving)
            reserving.add_done_callback(lambda done: self._give_back_late(done, tenant.id, month, amount))
            raise
        if not decision.allowed:
            raise BudgetExhausted(
                f"Account limited: the monthly budget of tenant {tenant.id} is used up "
                f"({decision.spent_micro} of {tenant.monthly_budget_micro} micro-units spent)"
            )
        request.reservation = Reservation(month, amount)

    async def settle(
        self,
        request: MeteredRequest,
        usage: Usage,
        *,
        status: UsageStatus,
        backend_id: str | None,
        region: str | None,
    ) -> bool:
        """Write the request's ledger record (once) and settle its budget reservation.

        Returns False when a record with this request id already existed (nothing written twice).
        """
        billable = billable_usage(status, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        ctx = request.ctx
        cost, version = self.cost(ctx.model_id, billable)
        record = UsageRecord(
            request_id=ctx.request_id,
            tenant_id=ctx.tenant_id,
            account_id=ctx.principal.account_id,
            key_id=ctx.principal.key.id,
            model=ctx.model_id,
            region=region,
            backend_id=backend_id,
            session_id=ctx.session_id,
            started_at=ctx.arrived_at,
            ended_at=max(ctx.arrived_at, time.time()),
            status=status,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=min(usage.cached_tokens, usage.prompt_tokens),
            completion_tokens=usage.completion_tokens,
            price_version=version,
            cost_micro=cost,
            metadata=dict(ctx.metadata),
            ttft_s=request.ttft_s,
            itl_s=request.itl_s,
        )
        written = await self._append(record)
        reservation = request.reservation
        if reservation is not None and not reservation.settled:
            reservation.settled = True
            try:
                await self.store.settle_budget(ctx.tenant_id, reservation.month, reservation.amount_micro, cost)
            except Exception as exc:  # the record is safe; the reservation stays counted (over, never under)
                log.warning("settling the budget failed", request_id=ctx.request_id, error=repr(exc))
        return written

    async def _append(self, record: UsageRecord) -> bool:
        try:
            written = await self.store.append_usage(record)
        except InvalidArgument:
            raise
        except Exception:
            if self.spool is None:
                raise
            log.warning("the ledger is unavailable; usage record spooled", request_id=record.request_id)
            await asyncio.to_thread(self.spool.append, record)
            self.metrics.usage_records.labels("spooled").inc()
            return True
        self.metrics.usage_records.labels("written" if written else "duplicate").inc()
        if not written:
            log.warning("usage record already in the ledger", request_id=record.request_id)
        return written

    def _give_back_late(
        self, reserving: asyncio.Future[BudgetDecision], tenant_id: str, month: str, amount: int
    ) -> None:
        self.giving_back.discard(reserving)  # its give-back, if any, joins the set in this same callback
        if reserving.cancelled():
            return
        # The store may or may not have applied it: nothing to settle here (a hosted store that sees
        # its answer come after the timeout gives it back itself; this path never does that twice).
        if reserving.exception() is not None:
            log.warning(
                "a reservation whose caller left failed", tenant_id=tenant_id, error=repr(reserving.exception())
            )
            return
        if not reserving.result().allowed:
            return  # nothing was reserved
        giving_back = asyncio.ensure_future(self.store.settle_budget(tenant_id, month, amount, 0))
        self.giving_back.add(giving_back)
        giving_back.add_done_callback(self._given_back)

    def _given_back(self, giving_back: asyncio.Future[int]) -> None:
        self.giving_back.discard(giving_back)
        if not giving_back.cancelled() and giving_back.exception() is not None:
            log.warning("giving back a reservation failed", error=repr(giving_back.exception()))

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Wait (at most `timeout_s`) until the reservations of callers that left are given back: the
        app's lifespan calls it before it closes the store, which would refuse the give-backs."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.giving_back:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                log.warning("reservations not given back at shutdown", count=len(self.giving_back))
                return
            await asyncio.wait(set(self.giving_back), timeout=left)

    async def release(self, request: MeteredRequest) -> None:
        """Give back a reservation for a request that never reached a backend."""
        reservation = request.reservation
        if reservation is not None and not reservation.settled:
            reservation.settled = True
            await self.store.settle_budget(request.ctx.tenant_id, reservation.month, reservation.amount_micro, 0)
