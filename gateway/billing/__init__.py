"""Billing: what the ledger's usage records cost, and getting them out of the gateway.

    metering.py    what a request may spend before it runs (budget), the one ledger record after
    prices.py      the default price table and the price history (every version a bill may name)
    rules.py       which tokens of a record are billable (one rule, used by metering and recompute)
    recompute.py   re-price records from their raw tokens and price version; report mismatches
    savings.py     what a record's cached tokens saved (the dashboard; the ledger's hourly sums)
    spool.py       local append-only JSONL spool for records the ledger could not take, and replay
    export.py      ledger -> one row per request + a summary per (tenant, model), deterministic
    formats.py     writing rows as CSV, JSONL or Parquet with fixed settings
    api.py         GET /admin/v1/billing/export

`edgerun billing export` (cli/billing.py) is the command-line face of `export.py`;
benchmarks/store/ledger.py measures ledger write throughput and metering cost per request.
"""
