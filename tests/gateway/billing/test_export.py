"""Billing exports: deterministic bytes, readable in every format, summary totals = row sums."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog

from cli.main import main
from gateway.billing.export import ROW_COLUMNS, ROWS, SUMMARY, SUMMED, ExportQuery, record_row, write_export
from gateway.billing.formats import FORMATS, Format, read_rows
from gateway.settings import GatewaySettings
from gateway.store import Store, open_store
from tests.gateway.billing.ledger_data import CURRENT, HISTORY, OLD, T0, fill, records

EVERYTHING = ExportQuery(T0 - 10, T0 + 3600)


async def export(store: Store, fmt: Format, query: ExportQuery = EVERYTHING) -> tuple[bytes, bytes]:
    rows, summary = io.BytesIO(), io.BytesIO()
    await write_export(store.ledger, query, HISTORY, fmt, rows, summary)
    return rows.getvalue(), summary.getvalue()


@pytest.fixture
def own_logging() -> Iterator[None]:
    """The CLI configures logging onto this test's captured stderr: put the previous set-up back."""
    saved, handlers = structlog.get_config(), logging.getLogger().handlers[:]
    yield
    structlog.configure(**saved)
    logging.getLogger().handlers[:] = handlers


@pytest.fixture
async def filled(store: Store) -> AsyncIterator[Store]:
    await fill(store, records())
    yield store


@pytest.mark.parametrize("fmt", FORMATS)
async def test_the_same_ledger_exports_byte_identical_files(
    fmt: Format, filled: Store, redis_url: str, redis_prefix: str
) -> None:
    first = await export(filled, fmt)
    assert await export(filled, fmt) == first
    # The same records in the other store, written in another order, give the same bytes.
    redis_store = open_store(GatewaySettings(redis_url=redis_url, key_prefix=redis_prefix).store)
    try:
        await fill(redis_store, records()[::-1])
        assert await export(redis_store, fmt) == first
    finally:
        await redis_store.aclose()


async def test_every_format_reads_back_to_the_same_rows_and_the_summary_adds_up(filled: Store) -> None:
    expected = [record_row(r, HISTORY) for r in sorted(records(), key=lambda r: (r.ended_us, r.request_id))]
    summaries = []
    for fmt in FORMATS:
        rows_bytes, summary_bytes = await export(filled, fmt)
        rows = read_rows(fmt, rows_bytes, ROWS)
        assert rows == expected, fmt
        assert list(rows[0]) == list(ROW_COLUMNS)
        summary = read_rows(fmt, summary_bytes, SUMMARY)
        summaries.append(summary)
        for column in SUMMED:
            assert sum(s[column] for s in summary) == sum(r[column] or 0 for r in rows), (fmt, column)
        for s in summary:
            mine = [r for r in rows if (r["tenant_id"], r["model"]) == (s["tenant_id"], s["model"])]
            assert s["num_requests"] == len(mine) > 0
            assert s["cost_micro"] == sum(r["cost_micro"] for r in mine)
        assert [(s["tenant_id"], s["model"]) for s in summary] == sorted({(r["tenant_id"], r["model"]) for r in rows})
    assert summaries[0] == summaries[1] == summaries[2]
    big_v1 = next(r for r in expected if r["price_version"] == "v1" and r["cached_tokens"] and r["status"] == "ok")
    price = HISTORY.get("@cf/a/big", "v1")
    assert price is not None and price.cached_input is not None
    exact = big_v1["cached_tokens"] * (price.input - price.cached_input) / 1e6  # what the cache saved
    assert abs(big_v1["savings_micro"] - exact) <= 1
    assert json.loads(expected[0]["metadata"]) == records()[0].metadata


async def test_the_range_is_end_exclusive_and_the_tenant_filter_applies(filled: Store) -> None:
    all_rows = read_rows("jsonl", (await export(filled, "jsonl"))[0], ROWS)
    cut = sorted(records(), key=lambda r: r.ended_us)[10].ended_at
    before = read_rows("jsonl", (await export(filled, "jsonl", ExportQuery(T0 - 10, cut)))[0], ROWS)
    assert before == all_rows[:10]
    acme = read_rows("jsonl", (await export(filled, "jsonl", ExportQuery(T0 - 10, T0 + 3600, "acme")))[0], ROWS)
    assert acme == [r for r in all_rows if r["tenant_id"] == "acme"] and 0 < len(acme) < len(all_rows)


def test_time_arguments_are_checked() -> None:
    assert ExportQuery.parse("2027-01-15", "2027-01-16T00:00:00Z").start == 1_800_000_000.0 - 8 * 3600
    with pytest.raises(ValueError, match="ISO 8601"):
        ExportQuery.parse("yesterday", "2027-01-16")
    with pytest.raises(ValueError, match="must be after"):
        ExportQuery.parse("2027-01-16", "2027-01-15")


async def test_the_cli_writes_rows_and_summary_files(
    filled: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    own_logging: None,
) -> None:
    monkeypatch.setenv("EDGERUN_REDIS_URL", "")
    monkeypatch.setenv("EDGERUN_SQLITE_PATH", str(tmp_path / "gateway.sqlite3"))  # the `store` fixture's file
    monkeypatch.setenv("EDGERUN_PRICES", json.dumps(CURRENT))
    monkeypatch.setenv("EDGERUN_PRICE_HISTORY", json.dumps(OLD))
    out = tmp_path / "bill.parquet"
    args = ["billing", "export", "--from", "2027-01-15T07:59:00Z", "--to", "2027-01-16", "--format", "parquet"]
    assert await asyncio.to_thread(main, [*args, "--out", str(out)]) == 0  # the CLI runs its own loop
    report = json.loads(capsys.readouterr().out)
    rows, summary = await export(filled, "parquet")
    assert out.read_bytes() == rows and (tmp_path / "bill.summary.parquet").read_bytes() == summary
    assert report["num_requests"] == 60 and report["cost_micro"] == sum(r.cost_micro for r in records())
    assert sorted(p.name for p in tmp_path.glob("*bill*")) == ["bill.parquet", "bill.summary.parquet"]

    recompute = ["billing", "recompute", "--from", "2027-01-15", "--to", "2027-01-16"]
    assert await asyncio.to_thread(main, recompute) == 0
    assert json.loads(capsys.readouterr().out)["mismatches"] == []
    bad = ["billing", "export", "--from", "soon", "--to", "2027-01-16", "--out", str(out)]
    assert await asyncio.to_thread(main, bad) == 1
    assert "ISO 8601" in capsys.readouterr().err
