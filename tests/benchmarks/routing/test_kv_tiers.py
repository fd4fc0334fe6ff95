"""benchmarks/routing/kv_tiers.py on a slice of the trace: the table and the goals' verdicts."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.routing.kv_tiers import DEFAULT_TRACE, main


def test_table_with_three_tier_setups_and_verdicts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    head = tmp_path / "head.jsonl"
    head.write_text("".join(DEFAULT_TRACE.read_text().splitlines(keepends=True)[:300]))
    argv = ["--trace", str(head), "--variants", "synthetic,tenants", "--kv-blocks-per-backend", "100"]
    assert main([*argv, "--host-tier", "2x", "--region-pool", "80x"]) == 0
    out = capsys.readouterr().out
    assert "KV pool 100 blocks each, host tier 200, regional pool 8000" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| synthetic", "| tenants"))]
    assert [row[1] for row in rows] == ["round_robin", "prefix_threshold", "cache_aware"] * 2
    for row in rows:
        none, host, both = (float(share.rstrip("%")) for share in row[2].split(" / "))
        assert both == 100.0 > max(none, host)  # the regional pool holds all 7,352 blocks of the slice
    assert out.count("lowest round_robin 100.0% of the ceiling (met); cache_aware p90") == 2
