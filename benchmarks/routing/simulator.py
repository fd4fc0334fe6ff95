"""Every evaluation trace x routing policy x gateway replica count, through the simulator.

    python -m benchmarks.routing.simulator [--trace data/mooncake_synthetic_trace.jsonl] [--seeds 0]
        [--replicas exact,1,4,16] [--policies prefix_threshold,cache_aware] [--write-traces DIR]

The evaluation traces are built from the one trace by `policies.sim.variants`, with each seed
for the variants that draw random numbers (tenants, heavy_sessions). 8 backends, each with a KV cache of 1/8 of the trace's
distinct blocks, as in `edgerun simulate`. Prints one markdown table: share of the ceiling and
work max/mean for each policy, and whether cache_aware meets the goal of issue 12 (>= 90% of
the ceiling, work max/mean <= 1.3, not below the reference policy prefix_threshold).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from policies.factory import PolicyConfig
from policies.sim.replay import SimConfig, SimResult, simulate
from policies.sim.trace import TraceRequest, num_distinct_blocks, prepare
from policies.sim.variants import VARIANTS

SEEDED = ("tenants", "heavy_sessions")  # the variants that draw random numbers
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "data" / "mooncake_synthetic_trace.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.routing.simulator", description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds for the variants (default 0)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"default: {','.join(VARIANTS)}")
    parser.add_argument("--replicas", default="exact,1,4,16", help="'exact' (one ideal gateway) and/or counts")
    parser.add_argument("--policies", default="prefix_threshold,cache_aware,least_tokens,session_hash")
    parser.add_argument("--write-traces", type=Path, default=None, metavar="DIR", help="also write each trace as JSONL")
    args = parser.parse_args(argv)
    with args.trace.open() as lines:
        raw = [TraceRequest.from_line(line, f"{args.trace}:{i}") for i, line in enumerate(lines, 1) if line.strip()]
    replicas = [None if r == "exact" else int(r) for r in args.replicas.split(",")]
    policies = args.policies.split(",")
    columns = " | ".join(f"{p} % of ceiling / work max/mean" for p in policies)
    print(f"| trace | seed | gateways | {columns} | cache_aware meets goal |")
    print("|---|---|---|" + "---|" * len(policies) + "---|")
    for variant in args.variants.split(","):
        for seed in [int(s) for s in args.seeds.split(",")] if variant in SEEDED else [0]:
            trace = VARIANTS[variant](raw, seed)
            if args.write_traces is not None:
                args.write_traces.mkdir(parents=True, exist_ok=True)
                lines = (json.dumps(r.to_record()) + "\n" for r in trace)
                (args.write_traces / f"{variant}-seed{seed}.jsonl").write_text("".join(lines))
            requests = prepare(trace)
            blocks = math.ceil(num_distinct_blocks(requests) / 8)
            for n in replicas:
                config = SimConfig(num_backends=8, kv_blocks_per_backend=blocks, replicas=n)
                results = {p: simulate(requests, PolicyConfig(p), config) for p in policies}
                cells = " | ".join(f"{r.share_of_ceiling:.1%} / {r.work_max_over_mean:.2f}" for r in results.values())
                print(f"| {variant} | {seed if variant in SEEDED else '-'} | {n or 'exact'} | {cells} | {_verdict(results)} |", flush=True)
    return 0


def _verdict(results: dict[str, SimResult]) -> str:
    ca, ref = results.get("cache_aware"), results.get("prefix_threshold")
    if ca is None:
        return "-"
    ok = ca.share_of_ceiling >= 0.9 and ca.work_max_over_mean <= 1.3
    if ref is not None:
        ok = ok and ca.share_of_ceiling >= ref.share_of_ceiling
    return "yes" if ok else "**no**"


if __name__ == "__main__":
    raise SystemExit(main())
