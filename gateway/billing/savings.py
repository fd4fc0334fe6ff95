"""What a usage record's cached tokens saved: its charge with no cached tokens minus its real charge,
under the record's own price version (`recompute.reprice`; None when the history lacks that version).

The dashboard shows it; the ledger keeps it in its hourly sums, computed when each record is written
(`record_savings`: the store calls it with every record it appends), so a dashboard over months
reads sums instead of re-pricing every record.
"""

from __future__ import annotations

from gateway.billing.prices import PriceHistory
from gateway.billing.recompute import reprice
from gateway.billing.settings import BillingSettings
from gateway.store.ledger import Savings
from gateway.store.models import UsageRecord
from policies.errors import PricingError


def savings(record: UsageRecord, history: PriceHistory) -> int | None:
    """What the record's cached tokens saved under its own price version (None: version unknown)."""
    if record.cached_tokens == 0:
        return 0
    charge = reprice(record, history)
    return None if charge is None else charge.savings_micros


def record_savings(billing: BillingSettings) -> Savings:
    """`savings` under the configured prices and price history, for the store (None for every record
    when the configuration is invalid: the gateway reports that itself)."""
    try:
        history = PriceHistory.from_config(billing.prices, billing.price_history)
    except PricingError:
        return lambda record: None
    return lambda record: savings(record, history)
