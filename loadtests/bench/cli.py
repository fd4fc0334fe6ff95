"""`python -m loadtests.bench` / `edgerun bench`: the serving benchmark and routing-policy comparison.

    python -m loadtests.bench --policies cache_aware,prefix_threshold,round_robin,least_tokens,session_hash \\
        --backends 2 --agent-load concurrency:2,concurrency:4 --trace-load trace:1 --out reports/bench

writes results.md (table + verdict), results.json, requests.jsonl, latency_vs_load.png and
policies.png to --out. With --gateway-url and --admin-token it runs against a gateway that is
already up instead of starting its own processes.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import asdict
from pathlib import Path

from loadtests.bench.metrics import SLO
from loadtests.bench.mooncake import DEFAULT_TRACE, TraceScale
from loadtests.bench.plots import write_plots
from loadtests.bench.report import markdown_table, verdict, write_reports
from loadtests.bench.runner import Load
from loadtests.bench.suite import ALL_POLICIES, WORKLOADS, BenchConfig, run_benchmark
from loadtests.conversations import parse_range
from loadtests.tenants import DEFAULT_TENANTS


def _list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _loads(text: str) -> tuple[Load, ...]:
    return tuple(Load.parse(part) for part in _list(text))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--policies", default=",".join(ALL_POLICIES), help="routing policies to compare, comma-separated")
    add("--backends", type=int, default=2, help="backends per run (default 2)")
    add("--workloads", default=",".join(WORKLOADS), help="agent and/or mooncake (default both)")
    add("--agent-load", default="concurrency:2,concurrency:4", help="load levels of the agent workload")
    add("--trace-load", default="trace:1", help="load levels of the trace replay (trace:<x time>, rate:, concurrency:)")
    add("--sessions", type=int, default=8, help="agent sessions per level (default 8)")
    add("--turns", default="5-8", help="turns per agent session, MIN-MAX (default 5-8)")
    add("--max-tokens", type=int, default=16, help="max_tokens of agent requests (default 16)")
    add("--trace", type=Path, default=DEFAULT_TRACE, help="Mooncake trace (JSONL)")
    add("--block-tokens", type=int, default=16, help="tokens per 512-token trace block (default 16)")
    add("--max-blocks", type=int, default=32, help="trace prompt cap in blocks (default 32)")
    add("--trace-groups", type=int, default=8, help="trace groups (first hash id) to replay (default 8)")
    add("--min-group-requests", type=int, default=2, help="only groups with this many requests (default 2)")
    add("--time-scale", type=float, default=1 / 16, help="trace time compression (default 1/16)")
    add("--output-scale", type=float, default=0.25, help="trace output_length -> max_tokens factor (default 0.25)")
    add("--max-output-tokens", type=int, default=16, help="trace max_tokens cap (default 16)")
    add("--slo-ttft", type=float, default=2.0, help="SLO on time to first token, seconds (default 2)")
    add("--slo-tpot-ms", type=float, default=250.0, help="SLO on time per output token, ms (default 250)")
    add("--max-level-seconds", type=float, default=300.0, help="a level stops sending after this long (default 300)")
    add("--max-active-sessions", type=int, default=8, help="rate loads: sessions open at once (default 8)")
    add("--tenants", default=DEFAULT_TENANTS, help=f"tenants as name:weight,... (default {DEFAULT_TENANTS})")
    add("--seed", type=int, default=0)
    add("--backend-arg", dest="backend_args", action="append", default=[], help="extra `edgerun backend` flag (repeat)")
    add("--out", type=Path, default=Path("reports/bench"), help="report folder (default reports/bench)")
    add("--gateway-url", help="benchmark this running gateway instead of starting processes")
    add("--admin-token", help="its admin token (with --gateway-url)")
    add("--label", default="external", help="policy label of results against --gateway-url")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    scale = TraceScale(block_tokens=args.block_tokens, max_blocks=args.max_blocks, output_scale=args.output_scale,
                       max_output_tokens=args.max_output_tokens, num_groups=args.trace_groups,
                       min_group_requests=args.min_group_requests, time_scale=args.time_scale)
    return BenchConfig(
        policies=_list(args.policies), num_backends=args.backends, workloads=_list(args.workloads),
        agent_loads=_loads(args.agent_load), trace_loads=_loads(args.trace_load), agent_sessions=args.sessions,
        agent_turns=parse_range(args.turns), max_tokens=args.max_tokens, trace_path=args.trace, trace_scale=scale,
        tenants=args.tenants, seed=args.seed, slo=SLO(args.slo_ttft, args.slo_tpot_ms / 1000),
        max_level_s=args.max_level_seconds, max_active_sessions=args.max_active_sessions,
        backend_args=tuple(args.backend_args), workdir=args.out / "processes", gateway_url=args.gateway_url,
        admin_token=args.admin_token, label=args.label,
    )


def command_line() -> str:
    prefix = "python -m loadtests.bench" if sys.argv[0].endswith("__main__.py") else "edgerun"
    return f"{prefix} {shlex.join(sys.argv[1:])}".strip()


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = run_benchmark(config, progress=lambda line: print(line, flush=True))
    config_json = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items() if k != "admin_token"}
    paths = write_reports(args.out, result.summaries, result.records, slo=config.slo, command=command_line(),
                          config=config_json, notes=result.notes)
    plots = write_plots(args.out, result.summaries)
    print()
    print(markdown_table(result.summaries))
    for line in verdict(result.summaries):
        print(line)
    for note in result.notes:
        print(f"note: {note}")
    print(f"\nwrote {', '.join(str(p) for p in [*paths.values(), *plots])}")
    return 0 if result.summaries and all(s.num_ok > 0 for s in result.summaries) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))
