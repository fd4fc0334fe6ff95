"""Re-price ledger records from their raw tokens and the price version each one names.

A record keeps what was billed (`cost_micro`) and why (`price_version`, token counts, status).
`recompute` prices the billable tokens again (`rules.billable_usage`) with that version's rates
from the `PriceHistory`, so an auditor can check every bill, or re-issue one, after prices have
changed. Records priced "unpriced" (no price configured) recompute to 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.billing.prices import PriceHistory
from gateway.billing.rules import billable_usage
from gateway.store.models import UsageRecord
from policies.pricing import Charge, charge

UNPRICED = "unpriced"  # = gateway.billing.metering.UNPRICED


@dataclass(frozen=True, slots=True)
class Repriced:
    request_id: str
    recorded_micro: int
    charge: Charge | None  # None: the record's price version is not in the history

    @property
    def matches(self) -> bool:
        return self.charge is not None and self.charge.cost_micros == self.recorded_micro


@dataclass(slots=True)
class Recomputation:
    repriced: list[Repriced] = field(default_factory=list)

    @property
    def mismatches(self) -> list[Repriced]:
        """Records whose recorded cost differs from their recomputed cost."""
        return [r for r in self.repriced if r.charge is not None and not r.matches]

    @property
    def unknown_versions(self) -> list[Repriced]:
        """Records naming a price version the history does not have (add it to price_history)."""
        return [r for r in self.repriced if r.charge is None]

    @property
    def total_recorded_micro(self) -> int:
        return sum(r.recorded_micro for r in self.repriced)

    @property
    def total_recomputed_micro(self) -> int:
        return sum(r.charge.cost_micros for r in self.repriced if r.charge is not None)


def reprice(record: UsageRecord, history: PriceHistory) -> Charge | None:
    """The record's charge under its own price version, or None when that version is unknown."""
    usage = billable_usage(record.status, record.prompt_tokens, record.completion_tokens, record.cached_tokens)
    if record.price_version == UNPRICED:
        return Charge(record.model, UNPRICED, 0, 0, None)
    price = history.get(record.model, record.price_version)
    return None if price is None else charge(usage, price)


def recompute(records: Iterable[UsageRecord], history: PriceHistory) -> Recomputation:
    """Re-price every record; see `Recomputation.mismatches` and `unknown_versions`."""
    result = Recomputation()
    for record in records:
        result.repriced.append(Repriced(record.request_id, record.cost_micro, reprice(record, history)))
    return result
