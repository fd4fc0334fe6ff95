"""Simulation results as markdown tables: one row per policy, or per policy and tier setup."""

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


def tier_table(keys: Sequence[str], setups: Sequence[str], rows: Sequence[tuple[Sequence[str], Sequence[SimResult]]]) -> str:
    """One row per (key cells, one result per tier setup in `setups`, same order): share of the
    ceiling, mean and p90 TTFT for each setup; the last setup's hits from host tiers and the
    regional pool (shares of all blocks); the first setup's p90 over the last's."""
    names = " / ".join(setups)
    header = [*keys, f"% of ceiling: {names}", f"host / region hits ({setups[-1]})", f"mean TTFT s: {names}",
              f"p90 TTFT s: {names}", "p90 gain"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for cells, results in rows:
        last = results[-1]
        lines.append("| " + " | ".join([
            *cells,
            " / ".join(f"{r.share_of_ceiling:.1%}" for r in results),
            f"{_share(last.host_hit_blocks, last.total_blocks):.1%} / {_share(last.region_hit_blocks, last.total_blocks):.1%}",
            " / ".join(f"{r.mean_ttft_s:.2f}" for r in results),
            " / ".join(f"{r.p90_ttft_s:.2f}" for r in results),
            f"{results[0].p90_ttft_s / last.p90_ttft_s:.2f}x" if last.p90_ttft_s else "-",
        ]) + " |")
    return "\n".join(lines)


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0
