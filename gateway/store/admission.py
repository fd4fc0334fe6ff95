"""Admission: what a request may take before it runs, and gives back when it ends.

A key's per-minute windows (requests and tokens, the sliding window of `policies.limits`), a
tenant's monthly budget (reservations, settled to the real cost), a tenant's concurrency slots,
and the request's tokens in flight on the backend it was routed to (kept by the routing state,
`gateway.store.routing`, which routing reads them from; admission takes and gives them back as part
of its two calls).

A request asks twice: `admit` checks and takes everything it needs at once (nothing is taken if
anything refuses), and `settle` gives everything back and appends its ledger record in one call.
`check_and_consume` counts a request against its key's windows on its own: the gateway counts
requests per minute on arrival, before a body is read.

Implementations: `local.admission.MemoryAdmission` (one process), `local.shared.SharedAdmission`
(several processes on one SQLite file) and `redis.admission.RedisAdmission`. Every
check-and-change is atomic across the replicas sharing the store (N replicas never allow N x a
limit or a budget). A replica that stops without settling (a crash) frees its slots and in-flight
tokens within `inflight_lease_s`; its reservations stay counted (over-charged, never under).

`Inflight`, `Claim`, `Admitted` and `Release` are messages built several times per request and
never changed once built (validated in `__post_init__`); they are not `frozen`, which would set each
field through `object.__setattr__` (about six times the cost of building one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from gateway.store.checks import check_count, check_id, check_month, check_text, check_tokens
from gateway.store.errors import InvalidArgument, TokensOverLimit
from gateway.store.models import LimitDecision, UsageRecord


@dataclass(slots=True)
class Inflight:
    """Tokens counted in flight on one backend: prompt tokens still to prefill, tokens to decode."""

    backend_id: str
    prefill_tokens: int
    decode_tokens: int

    def __post_init__(self) -> None:
        check_tokens(self.backend_id, self.prefill_tokens, self.decode_tokens)


@dataclass(slots=True)
class Claim:
    """What one request asks to take; a part left at its default is not asked for."""

    tenant_id: str
    request_id: str
    slot_limit: int | None = None  # a concurrency slot among at most this many of the tenant's
    key_id: str | None = None  # the key whose tokens-per-minute window counts `tokens`
    tpm: int | None = None  # None: no tokens-per-minute limit (nothing counted)
    tokens: int = 0
    month: str | None = None  # "YYYY-MM": reserve `amount_micro` against that month's budget; None: no reservation
    amount_micro: int = 0
    budget_micro: int | None = None  # None: unlimited (the spend is still counted)
    inflight: Inflight | None = None  # tokens to count on the backend the request was routed to

    def __post_init__(self) -> None:
        check_id("tenant id", self.tenant_id)
        check_text("request id", self.request_id)
        check_count("slot_limit", self.slot_limit, allow_none=True, positive=True)
        if self.tpm is not None:
            check_id("key id", self.key_id)
            check_count("tpm", self.tpm, positive=True)
            check_count("tokens", self.tokens)
            if self.tokens > self.tpm:
                raise TokensOverLimit(self.tokens, self.tpm)
        if self.month is not None:
            check_month(self.month)
            check_count("amount_micro", self.amount_micro)
            check_count("budget_micro", self.budget_micro, allow_none=True)


@dataclass(slots=True)
class Admitted:
    """`admit`'s answer: everything taken, or nothing and the first part that refused."""

    allowed: bool
    refused: Literal["slot", "tpm", "budget"] | None = None  # checked in this order
    retry_after_s: float = 0.0  # tpm: seconds until the same request would fit
    spent_micro: int = 0  # the month's spend after the decision (reservations included), when one was asked


@dataclass(slots=True)
class Release:
    """What one request gives back when it ends; a part left at its default is not given back."""

    tenant_id: str
    request_id: str
    slot: bool = False  # the concurrency slot `admit` took
    key_id: str | None = None  # the tokens-per-minute window to correct: counted -> used
    tokens_counted: int = 0
    tokens_used: int = 0
    month: str | None = None  # the reservation to replace with the cost; None: none
    reserved_micro: int = 0
    cost_micro: int = 0
    inflight: Inflight | None = None  # tokens still counted in flight

    def __post_init__(self) -> None:
        check_id("tenant id", self.tenant_id)
        check_text("request id", self.request_id)
        if self.key_id is not None:
            check_id("key id", self.key_id)
            check_count("tokens_counted", self.tokens_counted)
            check_count("tokens_used", self.tokens_used)
        if self.month is not None:
            check_month(self.month)
            check_count("reserved_micro", self.reserved_micro)
            check_count("cost_micro", self.cost_micro)

    @property
    def tokens_delta(self) -> int:
        """What the tokens-per-minute window is corrected by (0: nothing to do)."""
        return 0 if self.key_id is None else self.tokens_used - self.tokens_counted


class Admission(Protocol):
    # True when `admit` decides in this process's memory and never suspends (the one-process local
    # store): a caller that leaves cannot leave it half-way, so it needs no shield against cancellation.
    admits_at_once: bool

    async def check_and_consume(
        self, key_id: str, rpm: int | None, tpm: int | None, tokens_estimate: int, now: float | None = None
    ) -> LimitDecision:
        """Atomically decide one request against the key's per-minute limits and count it if allowed.

        `now` (epoch seconds) is for tests; None, what the gateway passes, is the store's own clock:
        Redis's `TIME` (read inside the script, so replicas with skewed clocks share one window) or
        the local store's clock.

        `rpm`/`tpm` None means unlimited. A refused request counts nothing; `retry_after_s` is when
        the same request would first fit and `which` names the refusing limit (the one that frees
        later when both refuse). Raises TokensOverLimit when `tokens_estimate` alone exceeds `tpm`.
        """
        ...

    async def admit(self, claim: Claim, now: float | None = None) -> Admitted:
        """Take everything `claim` asks for in one atomic step, or nothing.

        Checked in order: the concurrency slot (taking one the request holds already is allowed),
        the tokens-per-minute window (as `check_and_consume` with `tpm` only; `now` likewise), the
        month's budget (`spent + amount > budget` refuses). Then the slot is held (until `settle`, or
        the replica's lease), the tokens counted, the amount added to the month's spend, and the
        in-flight tokens counted on their backend.
        """
        ...

    async def settle(self, release: Release, record: UsageRecord | None = None, now: float | None = None) -> bool | None:
        """Give back what `release` names and append `record` to the ledger, in one call; the releases
        happen first, so whoever reads the record sees them done.

        The slot is freed (freeing twice is a no-op); the tokens-per-minute window is corrected by
        used - counted (in the current minute; a refund larger than it spills into the previous one;
        never below zero); the month's spend is replaced: spend + cost - reserved, never below zero;
        the in-flight tokens are uncounted (never below zero). Returns whether the record was written
        (False: its request id was in the ledger already, nothing written), None without a record.
        """
        ...

    async def budget_spent(self, tenant_id: str, month: str) -> int:
        """The month's spend so far, reservations included."""
        ...


def check_release_record(release: Release, record: UsageRecord | None) -> None:
    """The record settled with a release is the same request's."""
    if record is not None and not isinstance(record, UsageRecord):
        raise TypeError(f"settle takes a UsageRecord, got {type(record).__name__}")
    if record is not None and record.request_id != release.request_id:
        raise InvalidArgument(f"the record is request {record.request_id!r}'s, not {release.request_id!r}'s")
