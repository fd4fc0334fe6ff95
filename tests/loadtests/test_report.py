from __future__ import annotations

import json
from pathlib import Path

from loadtests.bench.client import RequestRecord
from loadtests.bench.metrics import SLO, LevelSummary, Percentiles
from loadtests.bench.plots import write_plots
from loadtests.bench.report import markdown_table, verdict, write_reports


def level(policy: str, cached: int, ttft_p90: float, *, load: str = "concurrency 2", value: float = 2,
          workload: str = "agent") -> LevelSummary:
    p = Percentiles(ttft_p90 / 2, ttft_p90, ttft_p90 * 1.5)
    return LevelSummary(policy, workload, load, value, 10, 10, {}, 5.0, 2.0, 20.0, 200.0, p, Percentiles(0.1, 0.2, 0.3),
                        Percentiles(0.1, 0.2, 0.3), p, 1.5, 0.75, 1000, cached, 100)


def test_verdict_says_plainly_whether_the_default_wins() -> None:
    holds = verdict([level("cache_aware", 800, 1.0), level("round_robin", 500, 2.0)])
    assert len(holds) == 2 and all(line.endswith("HOLDS") for line in holds)
    assert "80.0%" in holds[0] and "50.0%" in holds[0]
    fails = verdict([level("cache_aware", 800, 3.0), level("session_hash", 900, 2.0)])
    assert all(line.endswith("DOES NOT HOLD") for line in fails)
    assert "session_hash 90.0%" in fails[0] and "3.00 s" in fails[1]


def test_reports_and_plots_are_written(tmp_path: Path) -> None:
    summaries = [level(p, c, t, load=f"concurrency {v}", value=v) for v in (1, 2)
                 for p, c, t in (("cache_aware", 800, 1.0 * v), ("round_robin", 500, 2.0 * v))]
    summaries.append(level("cache_aware", 300, 4.0, load="trace x1", value=1, workload="mooncake"))
    records = [("cache_aware", "concurrency 1", RequestRecord("agent", "acme", "s", 0.0, ttft_s=0.5, e2e_s=1.0))]
    paths = write_reports(tmp_path, summaries, records, slo=SLO(), command="python -m loadtests.bench", config={},
                          notes=["a note"])
    markdown = paths["markdown"].read_text()
    assert markdown_table(summaries) in markdown and "HOLDS" in markdown and "a note" in markdown
    data = json.loads(paths["json"].read_text())
    assert len(data["summaries"]) == 5 and data["summaries"][0]["cached_token_ratio"] == 0.8
    assert json.loads(paths["requests"].read_text().splitlines()[0])["ttft_s"] == 0.5
    for png in write_plots(tmp_path, summaries):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
