"""PNG plots of benchmark results (matplotlib, headless Agg backend).

- latency_vs_load.png: TTFT and TPOT percentiles (p50 dashed, p90 solid, p99 dotted) against the
  load level, one colour per policy, one row per workload.
- policies.png: per policy, the cached-token ratio and the p90 TTFT, one bar per workload (at
  each workload's highest load level).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the headless backend)

from loadtests.bench.metrics import LevelSummary  # noqa: E402

STYLES = {"p50": "--", "p90": "-", "p99": ":"}


def _ordered(values: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(values))


def latency_vs_load(summaries: Sequence[LevelSummary], path: Path) -> Path:
    workloads = _ordered([s.workload for s in summaries])
    policies = _ordered([s.policy for s in summaries])
    colors = {p: f"C{i}" for i, p in enumerate(policies)}
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 3.6 * len(workloads)), squeeze=False)
    for row, workload in enumerate(workloads):
        for col, (metric, unit, scale) in enumerate((("ttft_s", "s", 1.0), ("tpot_s", "ms", 1000.0))):
            ax = axes[row][col]
            for policy in policies:
                points = sorted((s.load_value, getattr(s, metric)) for s in summaries
                                if s.workload == workload and s.policy == policy)
                for pct, style in STYLES.items():
                    xy = [(x, getattr(p, pct) * scale) for x, p in points if getattr(p, pct) is not None]
                    if xy:
                        xs, ys = zip(*xy)
                        ax.plot(xs, ys, style, marker="o", color=colors[policy],
                                label=f"{policy} {pct}" if pct == "p90" else None)
            loads = [s for s in summaries if s.workload == workload]
            mode = loads[0].load.split()[0] if loads else ""
            ax.set_xlabel(f"load ({mode})")
            ax.set_ylabel(f"{metric.split('_')[0].upper()} ({unit})")
            ax.set_title(f"{workload}: {metric.split('_')[0].upper()} p50 - - / p90 — / p99 ···")
            ax.grid(alpha=0.3)
            if row == 0 and col == 0:
                ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def policy_bars(summaries: Sequence[LevelSummary], path: Path) -> Path:
    workloads = _ordered([s.workload for s in summaries])
    policies = _ordered([s.policy for s in summaries])
    top = {w: max(s.load_value for s in summaries if s.workload == w) for w in workloads}
    picked = {(s.policy, s.workload): s for s in summaries if s.load_value == top[s.workload]}
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / max(1, len(workloads))
    for i, workload in enumerate(workloads):
        xs = [j + i * width for j in range(len(policies))]
        cached = [picked[(p, workload)].cached_token_ratio if (p, workload) in picked else 0.0 for p in policies]
        ttft = [(picked[(p, workload)].ttft_s.p90 or 0.0) if (p, workload) in picked else 0.0 for p in policies]
        left.bar(xs, cached, width, label=workload)
        right.bar(xs, ttft, width, label=workload)
    for ax, title in ((left, "cached-token ratio (higher is better)"), (right, "p90 TTFT, s (lower is better)")):
        ax.set_xticks([j + width * (len(workloads) - 1) / 2 for j in range(len(policies))], policies, rotation=15)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(out: Path, summaries: Sequence[LevelSummary]) -> list[Path]:
    if not summaries:
        return []
    out.mkdir(parents=True, exist_ok=True)
    return [latency_vs_load(summaries, out / "latency_vs_load.png"), policy_bars(summaries, out / "policies.png")]
