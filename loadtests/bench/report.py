"""Benchmark results as a markdown table, a JSON file, and a plain verdict on the default policy."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadtests.bench.client import RequestRecord
from loadtests.bench.metrics import SLO, LevelSummary, Percentiles

COLUMNS = (
    "policy", "workload", "load", "ok/sent", "req/s", "out tok/s", "TTFT p50/p90/p99 s", "TPOT p50/p90 ms",
    "ITL p50/p90/p99 ms", "E2E p50/p90 s", "goodput req/s", "SLO met", "cached", "errors",
)


def _s(p: Percentiles, *names: str, scale: float = 1.0, digits: int = 2) -> str:
    values = [getattr(p, n) for n in names]
    return "/".join("-" if v is None else f"{v * scale:.{digits}f}" for v in values)


def row(s: LevelSummary) -> list[str]:
    errors = ", ".join(f"{code}x{n}" for code, n in s.errors_by_code.items()) or "-"
    return [
        s.policy, s.workload, s.load, f"{s.num_ok}/{s.num_requests}", f"{s.request_throughput:.2f}",
        f"{s.output_token_throughput:.1f}", _s(s.ttft_s, "p50", "p90", "p99"),
        _s(s.tpot_s, "p50", "p90", scale=1000, digits=0), _s(s.itl_s, "p50", "p90", "p99", scale=1000, digits=0),
        _s(s.e2e_s, "p50", "p90"), f"{s.goodput:.2f}", f"{s.slo_attainment:.0%}", f"{s.cached_token_ratio:.1%}", errors,
    ]


def markdown_table(summaries: Sequence[LevelSummary]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(row(s)) + " |" for s in summaries]
    return "\n".join(lines)


def verdict(summaries: Sequence[LevelSummary], *, default_policy: str = "cache_aware",
            workload: str = "agent") -> list[str]:
    """Per load level of `workload`: does `default_policy` have the highest cached-token ratio and
    the lowest p90 TTFT of the policies run? Each line states the numbers either way."""
    lines = []
    for load in dict.fromkeys(s.load for s in summaries if s.workload == workload):
        level = [s for s in summaries if s.workload == workload and s.load == load]
        ours = next((s for s in level if s.policy == default_policy), None)
        others = [s for s in level if s.policy != default_policy]
        if ours is None or not others:
            continue
        best_cache = max(others, key=lambda s: s.cached_token_ratio)
        cache_ok = ours.cached_token_ratio >= best_cache.cached_token_ratio
        lines.append(
            f"{workload}, {load}: cached-token ratio {default_policy} {ours.cached_token_ratio:.1%} vs best other "
            f"{best_cache.policy} {best_cache.cached_token_ratio:.1%} -> {'HOLDS' if cache_ok else 'DOES NOT HOLD'}"
        )
        timed = [s for s in others if s.ttft_s.p90 is not None]
        if ours.ttft_s.p90 is None or not timed:
            lines.append(f"{workload}, {load}: p90 TTFT not comparable (no successful requests)")
            continue
        best_ttft = min(timed, key=lambda s: s.ttft_s.p90 or 0.0)
        ttft_ok = ours.ttft_s.p90 <= (best_ttft.ttft_s.p90 or 0.0)
        lines.append(
            f"{workload}, {load}: p90 TTFT {default_policy} {ours.ttft_s.p90:.2f} s vs best other "
            f"{best_ttft.policy} {best_ttft.ttft_s.p90:.2f} s -> {'HOLDS' if ttft_ok else 'DOES NOT HOLD'}"
        )
    return lines


def markdown_report(summaries: Sequence[LevelSummary], *, slo: SLO, command: str, notes: Sequence[str]) -> str:
    parts = [
        "# edgerun serving benchmark", "", f"Command: `{command}`", "",
        f"SLO: TTFT <= {slo.ttft_s:g} s and TPOT <= {slo.tpot_s * 1000:g} ms. "
        "Goodput = successful requests per second that met it.", "",
        markdown_table(summaries), "",
    ]
    lines = verdict(summaries)
    if lines:
        parts += ["## Default policy (cache_aware) on the agent workload", "", *(f"- {line}" for line in lines), ""]
    if notes:
        parts += ["## Notes", "", *(f"- {note}" for note in notes), ""]
    return "\n".join(parts)


def summary_json(s: LevelSummary) -> dict[str, Any]:
    return {**asdict(s), "cached_token_ratio": s.cached_token_ratio}


def write_reports(out: Path, summaries: Sequence[LevelSummary], records: Sequence[tuple[str, str, RequestRecord]], *,
                  slo: SLO, command: str, config: dict[str, Any], notes: Sequence[str]) -> dict[str, Path]:
    """results.md, results.json and requests.jsonl (one line per request, tagged policy and load)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"markdown": out / "results.md", "json": out / "results.json", "requests": out / "requests.jsonl"}
    paths["markdown"].write_text(markdown_report(summaries, slo=slo, command=command, notes=notes))
    paths["json"].write_text(json.dumps({
        "command": command, "config": config, "slo": asdict(slo), "notes": list(notes),
        "summaries": [summary_json(s) for s in summaries], "verdict": verdict(summaries),
    }, indent=2))
    with paths["requests"].open("w") as f:
        for policy, load, record in records:
            f.write(json.dumps({"policy": policy, "load": load, **asdict(record)}) + "\n")
    return paths
