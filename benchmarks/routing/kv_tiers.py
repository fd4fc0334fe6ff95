"""KV tiers in the simulator (issue 33; real processes: kv_pool.py): each trace x policy without tiers, with a host tier per
backend, and with a host tier plus a regional pool.

    python -m benchmarks.routing.kv_tiers [--trace data/mooncake_synthetic_trace.jsonl] [--seed 0]
        [--kv-blocks-per-backend 745] [--host-tier 2x] [--region-pool 32x]
        [--policies round_robin,prefix_threshold,cache_aware] [--variants ...]

Sizes are in 512-token blocks; `Kx` is K times one backend's KV pool. The defaults are one H100
serving an 8B-class model (128 KiB of KV a token, so 64 MiB a block): a KV pool of 745 blocks
(381k tokens, 47 GiB of HBM), a host tier of 2x (93 GiB of DRAM) and a regional pool of 32x
(1.45 TiB over the region's 8 backends, 186 GiB of DRAM each): 279 GiB of DRAM per GPU for KV, a
little more than the 256 GiB per GPU of a DGX H100. The regional pool then holds 54% of the
trace's distinct blocks. Copy and fetch rates are policies/sim/tiers.py's.

Prints one markdown table and, per trace, whether the issue's goals hold with the regional pool:
every policy >= 90% of the ceiling, and cache_aware's p90 TTFT at least 1.5x better than without
tiers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from policies.factory import PolicyConfig
from policies.sim.replay import SimConfig, SimResult, simulate
from policies.sim.report import tier_table
from policies.sim.tiers import parse_size
from policies.sim.trace import TraceRequest, prepare
from policies.sim.variants import VARIANTS

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "data" / "mooncake_synthetic_trace.jsonl"
SETUPS = ("none", "host", "host+region")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.routing.kv_tiers", description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--seed", type=int, default=0, help="seed of the variants that draw random numbers")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"default: {','.join(VARIANTS)}")
    parser.add_argument("--policies", default="round_robin,prefix_threshold,cache_aware")
    parser.add_argument("--backends", type=int, default=8)
    parser.add_argument("--kv-blocks-per-backend", type=int, default=745)
    parser.add_argument("--host-tier", default="2x", help="host tier per backend: blocks, or Kx the pool")
    parser.add_argument("--region-pool", default="32x", help="regional pool: blocks, or Kx one backend's pool")
    args = parser.parse_args(argv)
    with args.trace.open() as lines:
        raw = [TraceRequest.from_line(line, f"{args.trace}:{i}") for i, line in enumerate(lines, 1) if line.strip()]
    pool = args.kv_blocks_per_backend
    host, region = parse_size(args.host_tier, pool), parse_size(args.region_pool, pool)
    configs = [
        SimConfig(num_backends=args.backends, kv_blocks_per_backend=pool),
        SimConfig(num_backends=args.backends, kv_blocks_per_backend=pool, host_tier_blocks_per_backend=host),
        SimConfig(
            num_backends=args.backends, kv_blocks_per_backend=pool, host_tier_blocks_per_backend=host,
            region_pool_blocks=region,
        ),
    ]
    print(f"{args.backends} backends; KV pool {pool} blocks each, host tier {host}, regional pool {region} "
          f"(blocks of 512 tokens); seed {args.seed}\n")
    rows: list[tuple[list[str], list[SimResult]]] = []
    verdicts = []
    for variant in args.variants.split(","):
        requests = prepare(VARIANTS[variant](raw, args.seed))
        results = {p: [simulate(requests, PolicyConfig(p), c) for c in configs] for p in args.policies.split(",")}
        rows += [([variant, p], runs) for p, runs in results.items()]
        verdicts.append(f"- {variant}: {_verdict(results)}")
    print(tier_table(["trace", "policy"], SETUPS, rows))
    print("\nGoals with the regional pool (every policy >= 90% of the ceiling; cache_aware p90 TTFT >= 1.5x better):")
    print("\n".join(verdicts))
    return 0


def _verdict(results: dict[str, list[SimResult]]) -> str:
    lowest = min(results, key=lambda p: results[p][-1].share_of_ceiling)
    share = results[lowest][-1].share_of_ceiling
    parts = [f"lowest {lowest} {share:.1%} of the ceiling ({'met' if share >= 0.9 else '**not met**'})"]
    if "cache_aware" in results:
        none, pooled = results["cache_aware"][0], results["cache_aware"][-1]
        gain = none.p90_ttft_s / pooled.p90_ttft_s if pooled.p90_ttft_s else float("inf")
        parts.append(f"cache_aware p90 {gain:.2f}x ({'met' if gain >= 1.5 else '**not met**'})")
    return "; ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
