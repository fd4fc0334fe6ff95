"""benchmarks/routing/simulator.py on a slice of the trace: the table, and traces `edgerun simulate` reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.routing.simulator import DEFAULT_TRACE, main
from cli.main import main as edgerun


def test_table_and_written_traces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head = tmp_path / "head.jsonl"
    head.write_text("".join(DEFAULT_TRACE.read_text().splitlines(keepends=True)[:300]))
    out = tmp_path / "traces"
    argv = ["--trace", str(head), "--seeds", "0,1", "--variants", "one_session,tenants", "--replicas", "exact,2"]
    assert main([*argv, "--policies", "prefix_threshold,cache_aware", "--write-traces", str(out)]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| one_session") or line.startswith("| tenants")]
    assert len(rows) == 2 + 2 * 2  # one_session has no seed; tenants twice; each exact and 2 replicas
    assert all(row.endswith(("| yes |", "| **no** |")) for row in rows)
    assert sorted(p.name for p in out.iterdir()) == ["one_session-seed0.jsonl", "tenants-seed0.jsonl", "tenants-seed1.jsonl"]
    assert '"session_id": "everything"' in (out / "one_session-seed0.jsonl").read_text()
    assert edgerun(["simulate", "--trace", str(out / "tenants-seed1.jsonl"), "--policy", "cache_aware", "--replicas", "2"]) == 0
    assert "| cache_aware | 2 |" in capsys.readouterr().out
