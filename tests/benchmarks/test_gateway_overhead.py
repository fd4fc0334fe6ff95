"""benchmarks/gateway_overhead.py end to end: the shared stub backend as a real process, `edgerun
serve` in front of it, both sides driven in interleaved rounds, and the report table."""

from __future__ import annotations

import pytest

from benchmarks.gateway_overhead import main

pytestmark = pytest.mark.slow


def test_short_run_reports_both_sides(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--duration", "0.4", "--concurrency", "2", "--chunks", "3"]) == 0
    out = capsys.readouterr().out
    assert "| metric | direct to stub | through gateway | added |" in out
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in out.splitlines() if line.startswith("| ")}
    direct, through = (int(cell.split(" ")[0]) for cell in rows["requests (errors)"][:2])
    assert direct > 0 and through > 0
    assert "(0)" in rows["requests (errors)"][1]  # no request through the gateway failed


def test_half_capacity_rate_and_a_baseline_tree(capsys: pytest.CaptureFixture[str]) -> None:
    """`--rate half` measures capacity first; `--baseline-tree` adds a second gateway (here the same tree)."""
    from cli.processes import ROOT

    args = ["--duration", "0.4", "--concurrency", "2", "--chunks", "3", "--rate", "half", "--baseline-tree", str(ROOT)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "half the gateway's closed-loop capacity" in out
    assert "| metric | direct to stub | through gateway | through baseline gateway |" in out
