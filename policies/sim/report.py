"""Simulation results as a markdown table, one row per policy."""

from __future__ import annotations

from collections.abc import Sequence

from policies.sim.replay import SimResult

_HEADER = (
    "| policy | gateways | block hit ratio | % of ceiling | work max/mean | avg in-flight max/mean "
    "| peak in-flight max/mean | mean TTFT s | p99 TTFT s |"
)


def markdown_table(results: Sequence[SimResult]) -> str:
    lines = [_HEADER, "|" + "---|" * 9]
    for r in results:
        lines.append(
            f"| {r.policy} | {'exact' if r.replicas is None else r.replicas} | {r.hit_ratio:.1%} "
            f"| {r.share_of_ceiling:.1%} | {r.work_max_over_mean:.2f} "
            f"| {r.avg_in_flight_max_over_mean:.2f} | {r.peak_max_over_mean:.2f} "
            f"| {r.mean_ttft_s:.2f} | {r.p99_ttft_s:.2f} |"
        )
    if results:
        lines.append("")
        lines.append(f"ceiling (one unlimited cache, longest-prefix reuse): {results[0].ceiling_ratio:.1%} of blocks")
    return "\n".join(lines)
