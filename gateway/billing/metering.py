"""Metering: what a request may spend before it runs, and the one ledger record after it ran.

Before routing, `reservation` prices the worst case (every prompt token uncached, all of
max_tokens generated), which the request's admission reserves against the tenant's monthly budget
(gateway/pipeline/ticket.py: refused, 429 / 3036). After a request that reached a backend, `settle`
builds a `UsageRecord` from the final usage (prompt, cached, completion tokens), prices it with
`policies.pricing` (cached input at its discounted rate, integer micro-units), and hands it to the
store's `Admission.settle` together with the request's release (its reservation replaced by the
real cost, and what else its ticket holds), in one call: the record is appended to the ledger keyed
by the request id (the store makes that exactly-once) after the releases.

A model without a configured price is metered at cost 0 with price version "unpriced" (the
tokens are still recorded). Which tokens are billed for each status is `billing.rules`' one rule
(a backend failure or refusal costs nothing). A record the store cannot take (it is down) goes to
the local spool (`billing.spool`) and is replayed later; what that call would have released is then
left to the store's leases, and the reservation stays counted (the tenant is never under-charged),
never losing the record.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace

import structlog

from contracts.usage import Usage
from gateway.billing.rules import billable_usage
from gateway.billing.spool import LedgerSpool
from gateway.context import RequestContext
from gateway.metrics import GatewayMetrics
from gateway.store.admission import Release
from gateway.store.errors import InvalidArgument
from gateway.store.factory import Store
from gateway.store.models import UsageRecord, UsageStatus
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

    def price(self, model_id: str) -> Price | None:
        return self.prices.prices.get(model_id)

    def cost(self, model_id: str, usage: Usage) -> tuple[int, str]:
        price = self.price(model_id)
        if price is None:
            return 0, UNPRICED
        return cost_micros(usage, price), price.version

    def reservation(self, request: MeteredRequest, max_tokens: int) -> Reservation | None:
        """The worst-case cost to reserve against the tenant's monthly budget (None: nothing to reserve:
        free and unlimited)."""
        worst = Usage(prompt_tokens=request.prompt_tokens, completion_tokens=max_tokens, cached_tokens=0)
        amount, _ = self.cost(request.ctx.model_id, worst)
        if amount == 0 and request.ctx.principal.tenant.monthly_budget_micro is None:
            return None
        return Reservation(time.strftime("%Y-%m", time.gmtime(request.ctx.arrived_at)), amount)

    def record(
        self, request: MeteredRequest, usage: Usage, *, status: UsageStatus, backend_id: str | None,
        region: str | None,
    ) -> UsageRecord:
        """The request's ledger record, priced."""
        billable = billable_usage(status, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        ctx = request.ctx
        cost, version = self.cost(ctx.model_id, billable)
        return UsageRecord(
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

    async def settle(
        self,
        request: MeteredRequest,
        usage: Usage,
        *,
        status: UsageStatus,
        backend_id: str | None,
        region: str | None,
        release: Release | None = None,
    ) -> bool:
        """Write the request's ledger record (once) and settle its reservation, with `release` (what
        else the request gives back; None: its budget only), in one store call.

        Returns False when a record with this request id already existed (nothing written twice).
        """
        record = self.record(request, usage, status=status, backend_id=backend_id, region=region)
        release = self._with_budget(request, release, record.cost_micro)
        try:
            written = await self.store.admission.settle(release, record)
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
        return bool(written)

    async def release(self, request: MeteredRequest, release: Release | None = None) -> None:
        """Give back a reservation (and `release`) for a request that never reached a backend: no record."""
        release = self._with_budget(request, release, 0)
        if release.month is not None or release.slot or release.tokens_delta or release.inflight is not None:
            await self.store.admission.settle(release)

    def _with_budget(self, request: MeteredRequest, release: Release | None, cost_micro: int) -> Release:
        """`release` with the request's reservation replaced by `cost_micro`, once (a second settle of
        the same request gives back nothing more)."""
        ctx = request.ctx
        release = release or Release(ctx.tenant_id, ctx.request_id)
        reservation = request.reservation
        if reservation is None or reservation.settled:
            return release if release.month is None else replace(release, month=None)
        reservation.settled = True
        return replace(release, month=reservation.month, reserved_micro=reservation.amount_micro,
                       cost_micro=cost_micro)
