"""Billing's settings section (`[billing]`): prices, their history, and the local spool for
records the ledger cannot take. Each field is also accepted by its own name, e.g.
`EDGERUN_PRICES`, as gateway/settings.py explains. (Where the ledger keeps records is the
store's section: `ledger_archive_path`, `ledger_retention_s`...)"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gateway.billing.prices import default_prices


class BillingSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # model id -> price in policies.pricing's config form, e.g.
    # {"version": "2026-01", "input": "0.60", "cached_input": "0.10", "output": "3"} (per 1M tokens);
    # a model without one is metered at cost 0 (price version "unpriced"). The default prices the
    # default model (gateway/billing/prices.py), so `edgerun dev` meters real amounts.
    prices: dict[str, dict[str, str | int]] = Field(default_factory=default_prices)
    # Earlier price versions per model, in the form of `prices` (a list per model), kept so that records
    # billed under them can be recomputed and exported with their savings (gateway/billing/prices.py).
    price_history: dict[str, list[dict[str, str | int]]] = Field(default_factory=dict)
    # Append-only JSONL file for usage records the ledger cannot take (Redis down), replayed when it is
    # back; None: named after the store, next to sqlite_path (gateway/billing/spool.py).
    ledger_spool_path: str | None = None
    ledger_spool_replay_interval_s: float = Field(default=5.0, gt=0)  # how often pending records are retried
