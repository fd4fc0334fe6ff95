"""`edgerun billing ...`: billing exports, bill recomputation and the ledger spool, from the store.

    edgerun billing export --from ISO --to ISO [--tenant T] [--format csv|jsonl|parquet] --out FILE
                           [--summary-out FILE]
    edgerun billing recompute --from ISO --to ISO [--tenant T]
    edgerun billing replay-spool

`export` writes one row per request to FILE and the per-(tenant, model) summary to
`--summary-out`, by default FILE with `.summary` before its extension (`bill.csv` ->
`bill.summary.csv`); columns are in `gateway/billing/export.py`. Both files are written next to
their target and renamed into place, so a failed export leaves no half file. `recompute` re-prices
every record from its tokens and price version and exits 1 on any mismatch or unknown version.
`replay-spool` moves spooled records (written while the ledger was down) into the ledger now.

The commands open the store the settings name (`EDGERUN_*`, `EDGERUN_CONFIG`): Redis, or the
SQLite file of the local store (reading it while a gateway runs is safe).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

from gateway.billing.export import ExportQuery, write_export
from gateway.billing.formats import FORMATS, Format
from gateway.billing.prices import PriceHistory
from gateway.billing.recompute import recompute
from gateway.billing.savings import record_savings
from gateway.billing.spool import LedgerSpool, spool_path
from gateway.settings import GatewaySettings
from gateway.store.errors import StoreError
from policies.errors import PricingError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    ranged = argparse.ArgumentParser(add_help=False)
    ranged.add_argument("--from", dest="start", required=True, help="ISO 8601 start (inclusive), e.g. 2026-11-01")
    ranged.add_argument("--to", dest="end", required=True, help="ISO 8601 end (exclusive), e.g. 2026-12-01")
    ranged.add_argument("--tenant", help="one tenant's records only")
    export = actions.add_parser("export", parents=[ranged], help="write the billing export (rows + summary)")
    export.add_argument("--format", choices=FORMATS, default="csv")
    export.add_argument("--out", required=True, type=Path, help="rows file")
    export.add_argument("--summary-out", type=Path, help="summary file (default: OUT with .summary before the suffix)")
    actions.add_parser("recompute", parents=[ranged], help="re-price every record and report mismatches")
    actions.add_parser("replay-spool", help="move records spooled while the ledger was down into it now")


def summary_path(out: Path) -> Path:
    return out.with_name(f"{out.stem}.summary{out.suffix}")


async def _export(args: argparse.Namespace, settings: GatewaySettings, history: PriceHistory) -> dict[str, Any]:
    from gateway.store import open_store

    query = ExportQuery.parse(args.start, args.end, args.tenant)
    targets = [args.out, args.summary_out or summary_path(args.out)]
    temps = [t.with_name(f".{t.name}.{os.getpid()}.tmp") for t in targets]
    store = open_store(settings.store)
    try:
        with open(temps[0], "wb") as rows_out, open(temps[1], "wb") as summary_out:
            totals = await write_export(store.ledger, query, history, cast(Format, args.format), rows_out, summary_out)
            for f in (rows_out, summary_out):
                f.flush()
                os.fsync(f.fileno())
        for temp, target in zip(temps, targets):
            os.replace(temp, target)
    finally:
        await store.aclose()
        for temp in temps:
            temp.unlink(missing_ok=True)
    return {
        "rows": str(targets[0]),
        "summary": str(targets[1]),
        "num_requests": sum(int(t["num_requests"] or 0) for t in totals),
        "cost_micro": sum(int(t["cost_micro"] or 0) for t in totals),
    }


async def _recompute(args: argparse.Namespace, settings: GatewaySettings, history: PriceHistory) -> dict[str, Any]:
    from gateway.store import open_store

    query = ExportQuery.parse(args.start, args.end, args.tenant)
    store = open_store(settings.store)
    try:
        records = [r async for r in store.ledger.iter_usage(query.start, query.end, query.tenant_id)]
    finally:
        await store.aclose()
    result = recompute(records, history)
    return {
        "num_records": len(result.repriced),
        "recorded_micro": result.total_recorded_micro,
        "recomputed_micro": result.total_recomputed_micro,
        "mismatches": [
            {"request_id": r.request_id, "recorded_micro": r.recorded_micro, "recomputed_micro": r.charge.cost_micros}
            for r in result.mismatches
            if r.charge is not None
        ],
        "unknown_price_versions": [r.request_id for r in result.unknown_versions],
    }


async def _replay(settings: GatewaySettings) -> dict[str, Any]:
    from gateway.store import open_store

    path = spool_path(settings.billing, settings.store)
    if path is None:
        return {"spool": None, "written": 0}
    store = open_store(settings.store, record_savings(settings.billing))  # it writes records
    try:
        result = await LedgerSpool(path).replay(store.ledger)
    finally:
        await store.aclose()
    return {
        "spool": str(path),
        "written": result.written,
        "duplicates": result.duplicates,
        "corrupt": result.corrupt,
        "complete": result.complete,
    }


def logging_options(args: argparse.Namespace) -> dict[str, object]:
    """Warnings only: the output is a JSON report (see cli/main.py)."""
    return {"level": "warning", "json": False}


def run(args: argparse.Namespace) -> int:
    settings = GatewaySettings()
    try:
        history = PriceHistory.from_config(settings.billing.prices, settings.billing.price_history)
        if args.action == "export":
            report = asyncio.run(_export(args, settings, history))
        elif args.action == "recompute":
            report = asyncio.run(_recompute(args, settings, history))
        else:
            report = asyncio.run(_replay(settings))
    except (ValueError, StoreError, PricingError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2))
    if args.action == "recompute" and (report["mismatches"] or report["unknown_price_versions"]):
        return 1
    if args.action == "replay-spool" and report.get("complete") is False:
        return 1
    return 0
