"""benchmarks/store/ledger_keys.py on a small ledger: both kinds of id are timed and reported."""

from __future__ import annotations

import uuid

import pytest

from benchmarks.store.ledger_keys import main, v7


def test_v7_ids_are_what_the_gateway_makes() -> None:
    made = uuid.UUID(v7(1_780_000_000.123))
    assert (made.version, made.variant) == (7, uuid.RFC_4122)
    assert int(made.hex[:12], 16) == 1_780_000_000_123


def test_a_short_run_reports_both_kinds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--records", "2000", "--inserts", "200", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    for name in ("random (v4)", "time-ordered (v7)"):
        row = next(line for line in out.splitlines() if line.startswith(f"| {name} |"))
        assert float(row.split("|")[2]) > 0
