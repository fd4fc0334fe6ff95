"""Throughput and CPU per request of `edgerun serve --workers N` for several N, in one run.

    python -m benchmarks.workers [--workers 1 2 4] [--stores redis sqlite embedded] [--concurrency 50]
        [--duration 12] [--chunks 8]

Starts the stub backend (benchmarks/stub_backend.py) and, for each store and N, `edgerun serve
--workers N` in front of it: `--stores redis` (`--redis-url`, a fresh key prefix per gateway),
`sqlite` (the embedded store's file shared by the workers, gateway/store/embedded_shared.py) and
`embedded` (the one-process store, N=1 only: the baseline the shared modes cost against). N=1
uses the shared store too, so the rows of one store differ only in the number of processes. `concurrency` closed-loop
keep-alive clients (a lean raw HTTP/1.1 client, benchmarks/raw_load.py) stream completions; the
kernel spreads their connections over the workers (SO_REUSEPORT). CPU is summed over every
worker process. The rows alternate in `--rounds` rounds, each gateway started once and kept.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import operator
import os
import shlex
import sys
import tempfile
import uuid
from pathlib import Path

from benchmarks.gateway_overhead import create_key, start_gateway, start_stub
from benchmarks.machine import machine, process_cpu_s
from benchmarks.raw_load import Phase, drive
from benchmarks.stub_backend import MODEL_ID, PROMPT
from cli.processes import ChildProcess


def worker_pids(supervisor_pid: int) -> list[int]:
    """The supervisor's children (the workers), or the process itself for a lone gateway."""
    children = Path(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children").read_text().split()
    return [int(pid) for pid in children] or [supervisor_pid]


async def measure(gateway: ChildProcess, key: str, args: argparse.Namespace, slice_s: float) -> Phase:
    url = f"{gateway.url}/client/v4/accounts/bench/ai/run/{MODEL_ID}"
    body = {"prompt": PROMPT, "max_tokens": args.chunks, "stream": True}
    pids = worker_pids(gateway.process.pid)
    before = sum(process_cpu_s(pid) for pid in pids)
    phase = await drive("gateway", url, body, {"authorization": f"Bearer {key}"}, args.concurrency, slice_s)
    phase.cpu_s = sum(process_cpu_s(pid) for pid in pids) - before
    return phase


def store_env(store: str, redis_url: str) -> dict[str, str]:
    """The settings of each store measured: Redis (a fresh key prefix), the SQLite file shared by
    the workers, or (one process only) the embedded store's in-memory fast path."""
    if store == "redis":
        return {"EDGERUN_REDIS_URL": redis_url, "EDGERUN_KEY_PREFIX": f"edgerun-bench:{uuid.uuid4().hex[:8]}:"}
    return {"EDGERUN_SQLITE_SHARED": "true"} if store == "sqlite" else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.workers", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--stores", nargs="+", choices=["redis", "sqlite", "embedded"], default=["redis", "sqlite"],
                        help="shared stores measured at each N; embedded: the one-process store, at N=1 only")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--duration", type=float, default=12.0, help="seconds per row in all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args(argv)

    rows = [(store, n) for store in args.stores for n in args.workers if store != "embedded" or n == 1]
    stub = start_stub(args.chunks)
    gateways: dict[tuple[str, int], tuple[ChildProcess, str]] = {}
    workdir = Path(tempfile.mkdtemp(prefix="edgerun-workers-"))
    try:
        for store, n in rows:
            env = store_env(store, args.redis_url)
            gateway = start_gateway(stub.port, workdir / f"{store}-{n}", env, args=["--workers", str(n)])
            gateways[(store, n)] = (gateway, create_key(gateway.url, "bench"))

        async def run_all() -> dict[tuple[str, int], Phase]:
            pooled: dict[tuple[str, int], list[Phase]] = {row: [] for row in rows}
            for gateway, key in gateways.values():
                await measure(gateway, key, args, 1.5)  # warm-up
            for _ in range(args.rounds):
                for row, (gateway, key) in gateways.items():
                    pooled[row].append(await measure(gateway, key, args, args.duration / args.rounds))
            return {row: functools.reduce(operator.add, phases) for row, phases in pooled.items()}

        results = asyncio.run(run_all())
    finally:
        for gateway, _ in gateways.values():
            gateway.stop(timeout_s=20)
        stub.stop(timeout_s=10)

    command = "python -m benchmarks.workers " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    lines = [
        f"`{command.strip()}`  ",
        f"machine: {machine()}, load average {os.getloadavg()[0]:.1f}  ",
        f"{args.concurrency} closed-loop streaming clients (keep-alive), {args.chunks} chunks per answer, "
        f"{args.duration:g}s per row in {args.rounds} alternating rounds",
        "",
        "| store | workers | requests/s | p50 / p99 latency (ms) | gateway CPU per request (ms, all workers) | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (store, n), phase in results.items():
        cpu_ms = phase.cpu_s / max(1, len(phase.latencies_s)) * 1000
        lines.append(
            f"| {store} | {n} | {phase.rps:.0f} | {phase.pct(0.5):.1f} / {phase.pct(0.99):.1f} | {cpu_ms:.2f} "
            f"| {phase.errors} |"
        )
    print("\n".join(lines))
    return 0 if all(phase.errors == 0 for phase in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
