"""Decode speed served over HTTP: two `edgerun backend` processes that differ only in weight format.

    python -m benchmarks.backend.quant_speed --baseline float16 --subject auto --concurrency 1 16 --threads 2

Starts a backend per `--weight-dtype` (baseline: float16, the previous CPU default; subject: auto,
the fast mode's 4-bit weights), then for each concurrency runs the same greedy streams through both
in interleaved rounds (benchmarks/backend/server.py's round: random-token prompts, exactly
`--max-tokens` generated tokens, fresh cache_salt per round). Only one server works at a time.
Prints generated tokens/s (median over rounds), mean TTFT, server+client CPU ms per token, and the
subject/baseline ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import random
import shlex
import sys
import time

from backends.client import BackendClient, Endpoint
from benchmarks.backend.server import Summary, over_http, run_round
from benchmarks.common import interleave, machine, process_cpu_s
from cli.processes import ChildProcess
from engines.sampling_params import SamplingParams


def start_server(args: argparse.Namespace, weight_dtype: str) -> ChildProcess:
    options = ["--model", args.model, "--weight-dtype", weight_dtype, "--num-kv-blocks", str(args.num_kv_blocks),
               "--max-num-seqs", str(max(args.concurrency)), "--max-queue", "128", "--log-level", "warning"]
    if weight_dtype == "float32":
        options += ["--mode", "deterministic"]
    return ChildProcess.spawn(f"backend-{weight_dtype}", "backend", options, keep_edgerun_env=True, threads=args.threads)


async def main(args: argparse.Namespace) -> int:
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 30000) for _ in range(args.prompt_tokens)] for _ in range(max(args.concurrency))]
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    servers = [start_server(args, args.baseline), start_server(args, args.subject)]
    client = BackendClient(read_timeout_s=600, first_byte_timeout_s=600)
    try:
        for server in servers:
            server.wait_ready("/health", timeout_s=600)
        ones = [over_http(client, Endpoint(id=f"s{i}", base_url=s.url, region="local"), sampling) for i, s in enumerate(servers)]
        cpus = [functools.partial(lambda pid: process_cpu_s(pid) + time.process_time(), s.process.pid) for s in servers]
        for one in ones:  # warm-up: first forwards, allocator, connections
            await run_round(one, prompts, max(args.concurrency))
        print(f"Command: `python -m benchmarks.backend.quant_speed {shlex.join(sys.argv[1:])}`")
        print(f"Machine: {machine(with_torch=True)}, torch threads per server: {args.threads}, "
              f"load average at start {os.getloadavg()[0]:.1f}")
        print(f"Workload: {args.prompt_tokens}-token prompts, {args.max_tokens} generated tokens each (greedy, ignore_eos), "
              f"median of {args.rounds} alternating rounds\n")
        print(f"| streams | {args.baseline} tok/s | {args.subject} tok/s | ratio | {args.baseline} TTFT ms | "
              f"{args.subject} TTFT ms | {args.baseline} CPU ms/token | {args.subject} CPU ms/token |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
        for concurrency in args.concurrency:
            batch = prompts[:concurrency]
            paired = await interleave(
                functools.partial(run_round, ones[0], batch, concurrency, cpus[0]),
                functools.partial(run_round, ones[1], batch, concurrency, cpus[1]),
                args.rounds,
            )
            base, sub = Summary.of(paired.baseline), Summary.of(paired.subject)
            print(f"| {concurrency} | {base.tokens_per_s:.1f} | {sub.tokens_per_s:.1f} | "
                  f"{sub.tokens_per_s / base.tokens_per_s:.2f} | {base.ttft_ms:.0f} | {sub.ttft_ms:.0f} | "
                  f"{base.cpu_ms_per_token:.1f} | {sub.cpu_ms_per_token:.1f} |", flush=True)
        print(f"\nload average at end {os.getloadavg()[0]:.1f}")
    finally:
        for server in servers:
            server.stop(timeout_s=60)
        await client.aclose()
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.backend.quant_speed", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--baseline", default="float16", choices=["float32", "float16", "int4", "auto"])
    parser.add_argument("--subject", default="auto", choices=["float32", "float16", "int4", "auto"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2, help="torch threads per server")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args(sys.argv[1:]))))
