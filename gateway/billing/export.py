"""Billing exports: one row per ledger record, and a summary per (tenant, model).

Rows come in the ledger's own order (end time in microseconds, then request id), so the same
ledger always gives the same file. Columns, in this order:

    request_id, tenant_id, account_id, key_id, model, region, backend_id, session_id,
    started_at, ended_at (ISO 8601 UTC, microseconds), status (ok, cancelled, backend_error,
    rejected, cached), prompt_tokens (cached included), cached_tokens, uncached_prompt_tokens,
    completion_tokens, price_version, cost_micro (what was billed, micro-units), cost (the same
    in main units, a decimal string), savings_micro (what the cached tokens would have cost as
    input minus what they cost), neurons_micro, metadata (cf-aig-metadata as JSON text, keys
    sorted)

`session_id` and `metadata` hold text a client chose (`x-session-affinity`, `cf-aig-metadata`): in
CSV those cells alone are escaped against spreadsheet formulas (`formats.py`); every other column
is the gateway's own (ids such as "@cf/...", times, numbers) and is written as it is.

Savings and neurons are priced from the record's own price version (`PriceHistory`); they are
empty when that version is not configured (neither in `prices` nor in `price_history`), and
neurons also when the version has no neuron rates. The summary has one row per (tenant, model),
sorted, with the sums of the rows' token, cost, savings and neuron columns (empty ones count 0),
so its totals always equal the rows'.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import BinaryIO

from gateway.billing.formats import Columns, Format, Row, open_writer
from gateway.billing.prices import PriceHistory
from gateway.billing.recompute import reprice
from gateway.store.ledger import Ledger
from gateway.store.models import UsageRecord, to_us
from policies.pricing import format_micros

ROW_COLUMNS = (
    "request_id",
    "tenant_id",
    "account_id",
    "key_id",
    "model",
    "region",
    "backend_id",
    "session_id",
    "started_at",
    "ended_at",
    "status",
    "prompt_tokens",
    "cached_tokens",
    "uncached_prompt_tokens",
    "completion_tokens",
    "price_version",
    "cost_micro",
    "cost",
    "savings_micro",
    "neurons_micro",
    "metadata",
)
SUMMED = (
    "prompt_tokens",
    "cached_tokens",
    "uncached_prompt_tokens",
    "completion_tokens",
    "cost_micro",
    "savings_micro",
    "neurons_micro",
)
SUMMARY_COLUMNS = ("tenant_id", "model", "num_requests", *SUMMED, "cost", "savings")
INT_COLUMNS = frozenset({"num_requests", *SUMMED})
ROWS = Columns(ROW_COLUMNS, INT_COLUMNS, client_text=frozenset({"session_id", "metadata"}))
SUMMARY = Columns(SUMMARY_COLUMNS, INT_COLUMNS)  # no client text: tenant ids and models are the gateway's
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class ExportQuery:
    """Records with start <= ended_at < end (epoch seconds), of one tenant or all."""

    start: float
    end: float
    tenant_id: str | None = None

    @classmethod
    def parse(cls, start: str, end: str, tenant_id: str | None = None) -> ExportQuery:
        """From ISO 8601 strings ("2026-11-01", "2026-11-01T00:00:00Z"; no zone means UTC)."""
        query = cls(parse_time(start, "from"), parse_time(end, "to"), tenant_id or None)
        if query.end <= query.start:
            raise ValueError(f"'to' ({end}) must be after 'from' ({start})")
        return query


def parse_time(text: str, name: str) -> float:
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        example = "e.g. 2026-11-01 or 2026-11-01T12:00:00Z"
        raise ValueError(f"{name}={text!r} is not an ISO 8601 date or time, {example}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def iso_utc(t: float) -> str:
    """Epoch seconds -> "2026-11-22T18:41:09.318506Z", through whole microseconds (no float drift)."""
    return (_EPOCH + timedelta(microseconds=to_us(t))).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def record_row(record: UsageRecord, history: PriceHistory) -> Row:
    charge = reprice(record, history)
    return {
        "request_id": record.request_id,
        "tenant_id": record.tenant_id,
        "account_id": record.account_id,
        "key_id": record.key_id,
        "model": record.model,
        "region": record.region,
        "backend_id": record.backend_id,
        "session_id": record.session_id,
        "started_at": iso_utc(record.started_at),
        "ended_at": iso_utc(record.ended_at),
        "status": record.status,
        "prompt_tokens": record.prompt_tokens,
        "cached_tokens": record.cached_tokens,
        "uncached_prompt_tokens": record.prompt_tokens - record.cached_tokens,
        "completion_tokens": record.completion_tokens,
        "price_version": record.price_version,
        "cost_micro": record.cost_micro,
        "cost": format_micros(record.cost_micro),
        "savings_micro": None if charge is None else charge.savings_micros,
        "neurons_micro": None if charge is None else charge.neurons_micros,
        "metadata": json.dumps(record.metadata, sort_keys=True, ensure_ascii=False, separators=(",", ":")),
    }


class Summary:
    """Sums of the rows per (tenant, model)."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], dict[str, int]] = {}

    def add(self, row: Row) -> None:
        key = (str(row["tenant_id"]), str(row["model"]))
        group = self._groups.setdefault(key, dict.fromkeys(("num_requests", *SUMMED), 0))
        group["num_requests"] += 1
        for column in SUMMED:
            value = row[column]
            group[column] += value if isinstance(value, int) else 0

    def rows(self) -> list[Row]:
        out: list[Row] = []
        for (tenant, model), sums in sorted(self._groups.items()):
            row: Row = {"tenant_id": tenant, "model": model, **sums}
            row["cost"] = format_micros(sums["cost_micro"])
            row["savings"] = format_micros(sums["savings_micro"])
            out.append(row)
        return out


async def export_rows(ledger: Ledger, query: ExportQuery, history: PriceHistory) -> AsyncIterator[Row]:
    async for record in ledger.iter_usage(query.start, query.end, query.tenant_id):
        yield record_row(record, history)


async def write_export(
    ledger: Ledger,
    query: ExportQuery,
    history: PriceHistory,
    fmt: Format,
    rows_out: BinaryIO | None,
    summary_out: BinaryIO | None,
) -> list[Row]:
    """Write the rows to `rows_out` and the summary to `summary_out` (either may be None), both in
    `fmt`; returns the summary rows."""
    writer = open_writer(fmt, rows_out, ROWS) if rows_out is not None else None
    summary = Summary()
    async for row in export_rows(ledger, query, history):
        summary.add(row)
        if writer is not None:
            writer.write(row)
    if writer is not None:
        writer.close()
    totals = summary.rows()
    if summary_out is not None:
        summary_writer = open_writer(fmt, summary_out, SUMMARY)
        for row in totals:
            summary_writer.write(row)
        summary_writer.close()
    return totals
