from __future__ import annotations

from policies.sim.replay import SimResult
from policies.sim.report import markdown_table


def result(policy: str, hits: int) -> SimResult:
    return SimResult(policy, None, 10, hits, 100, 64, (10, 30), (5, 5), (1.0, 3.0), (4, 6), 0.25, 1.5)


def test_one_row_per_policy_with_ratios() -> None:
    table = markdown_table([result("round_robin", 16), result("cache_aware", 60)])
    lines = table.splitlines()
    assert lines[0].startswith("| policy | gateways | block hit ratio | % of ceiling | work max/mean")
    assert lines[2] == "| round_robin | exact | 16.0% | 25.0% | 1.50 | 1.50 | 1.00 | 0.25 | 1.50 |"
    assert lines[3].startswith("| cache_aware | exact | 60.0% | 93.8% |")
    assert lines[-1].endswith("64.0% of blocks")
