"""`edgerun simulate`: replay a Mooncake-format trace through the routing policies.

Only the glue lives here (arguments, reading the JSONL file, printing); the simulation itself
is pure (`policies.sim`) and calls the real policies through `policies.factory`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

from policies.errors import PolicyError
from policies.factory import PolicyConfig, policy_names
from policies.sim.replay import SimConfig, SimResult, simulate
from policies.sim.report import markdown_table, tier_table
from policies.sim.tiers import parse_size
from policies.sim.trace import SimRequest, TraceError, TraceRequest, num_distinct_blocks, prepare


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SimConfig()
    parser.add_argument("--trace", type=Path, required=True, help="JSONL trace (Mooncake format)")
    parser.add_argument("--backends", type=int, default=8, help="number of simulated backends (default 8)")
    parser.add_argument(
        "--kv-blocks-per-backend",
        type=int,
        default=None,
        help="KV cache size of each backend in trace blocks (default: distinct blocks in the trace / backends)",
    )
    parser.add_argument(
        "--policy", default="all", choices=[*policy_names(), "all"], help="policy to replay, or all (default)"
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="POLICY.NAME=VALUE",
        help="policy parameter, e.g. cache_aware.eps=0.5 (repeatable)",
    )
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    parser.add_argument("--block-size", type=int, default=512, help="tokens per trace hash id (default 512)")
    _add_rate(parser, "--prefill-tokens-per-s", defaults.prefill_tokens_per_s, "prefill speed of one backend")
    _add_rate(parser, "--decode-tokens-per-s", defaults.decode_tokens_per_s, "decode speed of one request")
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="simulate N independent gateway replicas fed by delayed KV events and loads "
        "(default: one gateway with an exact view of every cache)",
    )
    parser.add_argument(
        "--poll-interval-s",
        type=float,
        default=defaults.poll_interval_s,
        help=f"with --replicas: how often each replica reads KV events and loads (default {defaults.poll_interval_s:g})",
    )
    _add_tier_arguments(parser, defaults)
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write results as JSON")


def _add_tier_arguments(parser: argparse.ArgumentParser, defaults: SimConfig) -> None:
    parser.add_argument(
        "--host-tier-blocks",
        default="0",
        metavar="SIZE",
        help="a host-memory tier under each backend's KV pool, taking its evictions: blocks, or Kx the pool "
        "(e.g. 2x; default 0: none)",
    )
    parser.add_argument(
        "--region-pool-blocks",
        default="0",
        metavar="SIZE",
        help="a regional pool shared by the backends: blocks, or Kx one backend's pool (e.g. 32x; default 0: none)",
    )
    parser.add_argument(
        "--tiers",
        choices=["on", "off", "compare"],
        default="on",
        help="on: replay with the tiers given (default); off: without them; compare: both, then a table of the two",
    )
    _add_rate(parser, "--host-copy-tokens-per-s", defaults.host_copy_tokens_per_s,
              "copying KV back from a host tier, as policies/sim/tiers.py derives it")
    _add_rate(parser, "--region-fetch-tokens-per-s", defaults.region_fetch_tokens_per_s,
              "fetching KV from the regional pool, the same way")


def _add_rate(parser: argparse.ArgumentParser, flag: str, default: float, what: str) -> None:
    parser.add_argument(flag, type=float, default=default, help=f"{what} (default {default:g})")


def run(args: argparse.Namespace) -> int:
    try:
        requests = read_trace(args.trace, args.limit)
        params = parse_params(args.param)
        num_blocks = args.kv_blocks_per_backend or math.ceil(num_distinct_blocks(requests) / max(args.backends, 1))
        config = SimConfig(
            num_backends=args.backends,
            kv_blocks_per_backend=num_blocks,
            block_size=args.block_size,
            prefill_tokens_per_s=args.prefill_tokens_per_s,
            decode_tokens_per_s=args.decode_tokens_per_s,
            replicas=args.replicas,
            poll_interval_s=args.poll_interval_s,
            host_tier_blocks_per_backend=0 if args.tiers == "off" else parse_size(args.host_tier_blocks, num_blocks),
            region_pool_blocks=0 if args.tiers == "off" else parse_size(args.region_pool_blocks, num_blocks),
            host_copy_tokens_per_s=args.host_copy_tokens_per_s,
            region_fetch_tokens_per_s=args.region_fetch_tokens_per_s,
        )
        names = policy_names() if args.policy == "all" else [args.policy]
        policies = [PolicyConfig(name, params.get(name, {})) for name in names]
        results = [simulate(requests, policy, config) for policy in policies]
        untiered = dataclasses.replace(config, host_tier_blocks_per_backend=0, region_pool_blocks=0)
        baseline = [simulate(requests, policy, untiered) for policy in policies] if args.tiers == "compare" else []
    except (OSError, ValueError) as exc:  # PolicyError and TraceError are ValueErrors
        print(f"edgerun simulate: {exc}", file=sys.stderr)
        return 2
    print(
        f"trace {args.trace}: {len(requests)} requests; {config.num_backends} backends x "
        f"{config.kv_blocks_per_backend} KV blocks of {config.block_size} tokens; prefill "
        f"{config.prefill_tokens_per_s:g} tok/s per backend, decode {config.decode_tokens_per_s:g} tok/s per request; "
        + ("one gateway, exact view" if config.replicas is None else
           f"{config.replicas} gateway replicas polling every {config.poll_interval_s:g} s")
        + (f"; tiers: host {config.host_tier_blocks_per_backend} blocks per backend "
           f"({config.host_copy_tokens_per_s:g} tok/s), regional pool {config.region_pool_blocks} blocks "
           f"({config.region_fetch_tokens_per_s:g} tok/s)" if config.has_tiers else "")
        + "\n"
    )
    print(markdown_table(results))
    if baseline:
        rows = [([r.policy], [b, r]) for b, r in zip(baseline, results, strict=True)]
        print("\nWithout and with the tiers:\n")
        print(tier_table(["policy"], ["no tiers", "tiers"], rows))
    if args.json is not None:
        args.json.write_text(json.dumps(as_json(args, config, results, baseline), indent=2) + "\n")
    return 0


def read_trace(path: Path, limit: int | None) -> list[SimRequest]:
    records: list[TraceRequest] = []
    with path.open() as f:
        for line_no, line in enumerate(f, 1):
            if limit is not None and len(records) >= limit:
                break
            if line.strip():
                records.append(TraceRequest.from_line(line, f"{path}:{line_no}"))
    if not records:
        raise TraceError(f"{path}: no requests")
    return prepare(records)


def parse_params(items: list[str]) -> dict[str, dict[str, str]]:
    params: dict[str, dict[str, str]] = {}
    for item in items:
        name, _, value = item.partition("=")
        policy, _, key = name.partition(".")
        if not value or not key or policy not in policy_names():
            raise PolicyError(f"--param {item!r}: write POLICY.NAME=VALUE with POLICY one of {policy_names()}")
        params.setdefault(policy, {})[key] = value
    return params


def as_json(
    args: argparse.Namespace, config: SimConfig, results: list[SimResult], baseline: list[SimResult]
) -> dict[str, object]:
    data: dict[str, object] = {
        "trace": str(args.trace),
        "config": {
            "num_backends": config.num_backends,
            "kv_blocks_per_backend": config.kv_blocks_per_backend,
            "block_size": config.block_size,
            "prefill_tokens_per_s": config.prefill_tokens_per_s,
            "decode_tokens_per_s": config.decode_tokens_per_s,
            "replicas": config.replicas,
            "poll_interval_s": config.poll_interval_s,
            "host_tier_blocks_per_backend": config.host_tier_blocks_per_backend,
            "region_pool_blocks": config.region_pool_blocks,
            "host_copy_tokens_per_s": config.host_copy_tokens_per_s,
            "region_fetch_tokens_per_s": config.region_fetch_tokens_per_s,
        },
        "results": [r.as_dict() for r in results],
    }
    if baseline:
        data["results_without_tiers"] = [r.as_dict() for r in baseline]
    return data
