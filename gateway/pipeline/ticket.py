"""What one request takes before it runs and gives back when it ends: one store call each way.

`Admitter.admit` asks the store's admission for everything the request needs at once (`Claim`):
one of its tenant's concurrency slots (`gateway.pipeline.concurrency`), its token estimate against
the key's tokens-per-minute, its worst-case cost reserved against the tenant's monthly budget
(`gateway.billing.metering`), and its tokens in flight on the backend routing chose. Nothing is
taken if any part refuses; the first part that refused gives the client its error (429 with
Retry-After for the slot and the rate, 413 when the estimate alone exceeds the key's tpm, 429 /
3036 for the budget). The `Ticket` it returns is given back once, when the request is settled:
`Metering.settle` writes the ledger record and releases the ticket (`Ticket.release`) in the same
store call.

An admit whose caller leaves while it is in flight (client gone, shutdown) still lands; nobody
would settle it, so it is given back once it lands (`aclose`, in the app's lifespan before the
store closes, waits for those). The one-process store decides without suspending
(`Admission.admits_at_once`): nothing can be left in flight there, and no task is spent on it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import structlog

from gateway.billing.metering import MeteredRequest, Metering
from gateway.context import RequestContext
from gateway.errors import BudgetExhausted, GatewayError, RateLimited, RequestTooLarge
from gateway.pipeline.concurrency import TenantSlots
from gateway.store.admission import Admission, Admitted, Claim, Inflight, Release
from gateway.store.errors import TokensOverLimit

log = structlog.get_logger("edgerun.gateway.ticket")


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a request was admitted with."""

    claim: Claim

    def release(self, tokens_used: int, inflight: Inflight | None, *, reserved_micro: int = 0,
                cost_micro: int = 0) -> Release:
        """Everything back: the slot, the window corrected to `tokens_used`, the reservation replaced
        by `cost_micro`, the tokens still in flight."""
        claim = self.claim
        return Release(
            tenant_id=claim.tenant_id, request_id=claim.request_id, slot=claim.slot_limit is not None,
            key_id=claim.key_id if claim.tpm is not None else None, tokens_counted=claim.tokens,
            tokens_used=tokens_used, month=claim.month, reserved_micro=reserved_micro, cost_micro=cost_micro,
            inflight=inflight,
        )


class Admitter:
    def __init__(self, admission: Admission, metering: Metering, slots: TenantSlots) -> None:
        self.admission = admission
        self.metering = metering
        self.slots = slots
        self.giving_back: set[asyncio.Future[Any]] = set()  # admits of callers that left, then their give-backs

    async def admit(
        self, metered: MeteredRequest, tokens: int, max_tokens: int, inflight: Inflight | None = None
    ) -> Ticket:
        """Take the request's slot, its `tokens` against the key's tpm, its worst case (the prompt and
        `max_tokens`) against the budget, and `inflight`, in one call; raises the refusing part's error."""
        ctx = metered.ctx
        key, tenant = ctx.principal.key, ctx.principal.tenant
        reservation = self.metering.reservation(metered, max_tokens)
        try:
            claim = Claim(
                tenant.id, ctx.request_id, slot_limit=self.slots.limit(tenant),
                key_id=key.id, tpm=key.tpm, tokens=tokens if key.tpm is not None else 0,
                month=None if reservation is None else reservation.month,
                amount_micro=0 if reservation is None else reservation.amount_micro,
                budget_micro=tenant.monthly_budget_micro, inflight=inflight,
            )
        except TokensOverLimit as exc:
            raise RequestTooLarge(str(exc), param="max_tokens") from exc
        if self.admission.admits_at_once:  # decided without suspending: a caller cannot leave it half-way
            decision = await self.admission.admit(claim)
        else:
            decision = await self._admit_shielded(claim)
        if not decision.allowed:
            raise self._refusal(decision, ctx)
        metered.reservation = reservation
        return Ticket(claim)

    async def _admit_shielded(self, claim: Claim) -> Admitted:
        admitting = asyncio.ensure_future(self.admission.admit(claim))
        try:
            return await asyncio.shield(admitting)
        except asyncio.CancelledError:
            # The caller left while the admit was in flight: the store still applies it, and nobody would
            # settle it. Give it back once it lands.
            self.giving_back.add(admitting)
            admitting.add_done_callback(lambda done: self._give_back_late(done, Ticket(claim)))
            raise

    def _refusal(self, decision: Admitted, ctx: RequestContext) -> GatewayError:
        key, tenant = ctx.principal.key, ctx.principal.tenant
        if decision.refused == "slot":
            return self.slots.refused(tenant)
        if decision.refused == "tpm":
            return RateLimited(
                f"Rate limited: this API key allows {key.tpm} tokens per minute; retry in {decision.retry_after_s:.1f}s",
                retry_after_s=decision.retry_after_s,
            )
        return BudgetExhausted(
            f"Account limited: the monthly budget of tenant {tenant.id} is used up "
            f"({decision.spent_micro} of {tenant.monthly_budget_micro} micro-units spent)"
        )

    def _give_back_late(self, admitting: asyncio.Future[Admitted], ticket: Ticket) -> None:
        self.giving_back.discard(admitting)  # its give-back, if any, joins the set in this same callback
        if admitting.cancelled():
            return
        if admitting.exception() is not None:  # the store may or may not have applied it: nothing to settle here
            log.warning("an admit whose caller left failed", request_id=ticket.claim.request_id,
                        error=repr(admitting.exception()))
            return
        if not admitting.result().allowed:
            return  # nothing was taken
        release = ticket.release(0, ticket.claim.inflight, reserved_micro=ticket.claim.amount_micro)
        giving_back = asyncio.ensure_future(self.admission.settle(release))
        self.giving_back.add(giving_back)
        giving_back.add_done_callback(self._given_back)

    def _given_back(self, giving_back: asyncio.Future[Any]) -> None:
        self.giving_back.discard(giving_back)
        if not giving_back.cancelled() and giving_back.exception() is not None:
            log.warning("giving back an admit failed", error=repr(giving_back.exception()))

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Wait (at most `timeout_s`) until the admits of callers that left are given back: the app's
        lifespan calls it before it closes the store, which would refuse the give-backs."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.giving_back:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                log.warning("admits not given back at shutdown", count=len(self.giving_back))
                return
            await asyncio.wait(set(self.giving_back), timeout=left)
