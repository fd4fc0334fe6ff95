from __future__ import annotations

import dataclasses

from policies.sim.replay import SimResult
from policies.sim.report import markdown_table, tier_table


def result(policy: str, hits: int) -> SimResult:
    return SimResult(policy, None, 10, hits, 100, 64, (10, 30), (5, 5), (1.0, 3.0), (4, 6), 0.25, 1.5)


def test_one_row_per_policy_with_ratios() -> None:
    table = markdown_table([result("round_robin", 16), result("cache_aware", 60)])
    lines = table.splitlines()
    assert lines[0].startswith("| policy | gateways | block hit ratio | % of ceiling | work max/mean")
    assert lines[2] == "| round_robin | exact | 16.0% | 25.0% | 1.50 | 1.50 | 1.00 | 0.25 | 1.50 |"
    assert lines[3].startswith("| cache_aware | exact | 60.0% | 93.8% |")
    assert lines[-1].endswith("64.0% of blocks")


def test_tier_table_compares_setups_per_row() -> None:
    without = dataclasses.replace(result("cache_aware", 32), p90_ttft_s=1.0)
    with_tiers = dataclasses.replace(result("cache_aware", 60), p90_ttft_s=0.5, host_hit_blocks=20, region_hit_blocks=10)
    lines = tier_table(["trace", "policy"], ["none", "both"], [(["t", "cache_aware"], [without, with_tiers])]).splitlines()
    assert lines[0].startswith("| trace | policy | % of ceiling: none / both | host / region hits (both) |")
    assert lines[2] == "| t | cache_aware | 50.0% / 93.8% | 20.0% / 10.0% | 0.25 / 0.25 | 1.00 / 0.50 | 2.00x |"
