"""Throughput and CPU per request of `edgerun serve --workers N` for several N, in one run.

    python -m benchmarks.workers [--workers 1 2 4] [--stores redis sqlite embedded] [--concurrency 50]
        [--duration 12] [--chunks 8] [--stub-procs 1] [--client-procs 1] [--baseline-tree PATH]

Starts the stub backend (benchmarks/stub_backend.py) and, for each store and N, `edgerun serve
--workers N` in front of it: `--stores redis` (`--redis-url`, a fresh key prefix per gateway),
`sqlite` (the embedded store's file shared by the workers, gateway/store/embedded_shared.py) and
`embedded` (the one-process store, N=1 only: the baseline the shared modes cost against). N=1
uses the shared store too, so the rows of one store differ only in the number of processes. `concurrency` closed-loop
keep-alive clients (a lean raw HTTP/1.1 client, benchmarks/raw_load.py) stream completions; the
kernel spreads their connections over the workers (SO_REUSEPORT). CPU is summed over every
worker process. The rows alternate in `--rounds` rounds, each gateway started once and kept.
On a machine with many cores, `--stub-procs` stub processes share the stub's port (SO_REUSEPORT) and
`--client-procs` processes share the clients, so neither the stub nor the load generator is what
saturates first; their CPU per request is reported beside the gateway's. `--baseline-tree` runs
each row's gateway from another checkout too (rows marked "baseline"), in the same rounds: before/after.
A row with errors lists them by HTTP status (or the client's exception) with the first answer of each.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing
import operator
import os
import shlex
import sys
import tempfile
import uuid
from collections import Counter
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import stub_backend
from benchmarks.gateway_overhead import create_key, start_gateway
from benchmarks.machine import machine, process_cpu_s
from benchmarks.raw_load import Phase, drive
from benchmarks.stub_backend import MODEL_ID, PROMPT
from cli.processes import ROOT, ChildProcess, free_port


@dataclass
class Load:
    """Where the load comes from: the stub processes (their CPU is counted too) and the client pool."""

    stubs: list[ChildProcess]
    pool: Executor | None  # None: the clients run in this process


def start_stubs(num_chunks: int, num_procs: int) -> list[ChildProcess]:
    """One stub, or `num_procs` sharing one port (SO_REUSEPORT)."""
    port = free_port()
    reuse = num_procs > 1
    stubs = [ChildProcess.launch("stub", stub_backend.command(port, num_chunks, reuse_port=reuse), port)
             for _ in range(num_procs)]
    for stub in stubs:
        stub.wait_ready("/health")
    return stubs


def drive_in_process(url: str, body: dict[str, Any], headers: dict[str, str], concurrency: int, duration_s: float
                     ) -> tuple[Phase, float]:
    """`drive` in a client process (uvloop when installed) -> its phase and the CPU it used."""
    try:
        import uvloop

        loop_factory: Any = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    before = process_cpu_s(os.getpid())
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        phase = runner.run(drive("gateway", url, body, headers, concurrency, duration_s))
    return phase, process_cpu_s(os.getpid()) - before


def shares(total: int, parts: int) -> list[int]:
    """`total` clients over `parts` processes, as evenly as possible (none empty)."""
    return [n for n in (total // parts + (i < total % parts) for i in range(parts)) if n]


def worker_pids(supervisor_pid: int) -> list[int]:
    """The supervisor's children (the workers), or the process itself for a lone gateway."""
    children = Path(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children").read_text().split()
    return [int(pid) for pid in children] or [supervisor_pid]


@dataclass
class Measured:
    phase: Phase  # the clients' requests; cpu_s: the gateway's (all workers)
    stub_cpu_s: float = 0.0
    client_cpu_s: float = 0.0

    def __add__(self, other: Measured) -> Measured:
        return Measured(self.phase + other.phase, self.stub_cpu_s + other.stub_cpu_s,
                        self.client_cpu_s + other.client_cpu_s)


async def measure(gateway: ChildProcess, key: str, args: argparse.Namespace, slice_s: float, load: Load) -> Measured:
    url = f"{gateway.url}/client/v4/accounts/bench/ai/run/{MODEL_ID}"
    body = {"prompt": PROMPT, "max_tokens": args.chunks, "stream": True}
    headers = {"authorization": f"Bearer {key}"}
    pids = worker_pids(gateway.process.pid)
    stub_pids = [stub.process.pid for stub in load.stubs]
    before = sum(process_cpu_s(pid) for pid in pids)
    stub_before = sum(process_cpu_s(pid) for pid in stub_pids)
    if load.pool is None:
        client_before = process_cpu_s(os.getpid())
        phase = await drive("gateway", url, body, headers, args.concurrency, slice_s)
        client_cpu = process_cpu_s(os.getpid()) - client_before
    else:
        loop = asyncio.get_running_loop()
        parts = await asyncio.gather(*(
            loop.run_in_executor(load.pool, drive_in_process, url, body, headers, n, slice_s)
            for n in shares(args.concurrency, args.client_procs)
        ))
        # the parts ran side by side: their requests add up over the longest one's time
        phase = Phase("gateway", [t for part, _ in parts for t in part.latencies_s], sum(part.errors for part, _ in parts),
                      max(part.elapsed_s for part, _ in parts), failures=sum((part.failures for part, _ in parts), Counter()),
                      samples={k: v for part, _ in parts for k, v in part.samples.items()})
        client_cpu = sum(cpu for _, cpu in parts)
    phase.cpu_s = sum(process_cpu_s(pid) for pid in pids) - before
    return Measured(phase, sum(process_cpu_s(pid) for pid in stub_pids) - stub_before, client_cpu)


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
    parser.add_argument("--stub-procs", type=int, default=1, help="stub backend processes sharing its port")
    parser.add_argument("--client-procs", type=int, default=1,
                        help="load generator processes (1: the clients run in this process)")
    parser.add_argument("--baseline-tree", type=Path,
                        help="another checkout whose gateways run too, in the same rounds (before/after)")
    args = parser.parse_args(argv)
    if args.stub_procs < 1 or not 1 <= args.client_procs <= args.concurrency:
        parser.error("--stub-procs must be >= 1 and --client-procs between 1 and --concurrency")

    trees = [("", ROOT)] + ([(" (baseline)", args.baseline_tree.resolve())] if args.baseline_tree else [])
    rows = [(store, n, label, tree) for store in args.stores for n in args.workers if store != "embedded" or n == 1
            for label, tree in trees]
    pool = None
    if args.client_procs > 1:
        pool = ProcessPoolExecutor(args.client_procs, mp_context=multiprocessing.get_context("spawn"))
    load = Load(start_stubs(args.chunks, args.stub_procs), pool)
    gateways: dict[tuple[str, int], tuple[ChildProcess, str]] = {}  # (store and tree, N) -> gateway, key
    workdir = Path(tempfile.mkdtemp(prefix="edgerun-workers-"))
    try:
        for store, n, label, tree in rows:
            # every client connects from 127.0.0.1: a listener's per-address connection cap (64) must hold them all,
            # or the connections past it are answered 503 and closed, and closed-loop clients spin on that
            env = {**store_env(store, args.redis_url), "EDGERUN_MAX_CONNECTIONS_PER_CLIENT": str(args.concurrency)}
            gateway = start_gateway(load.stubs[0].port, workdir / f"{store}-{n}{label.strip(' ()')}", env,
                                    cwd=tree, args=["--workers", str(n)])
            # the tenant's in-flight limit (128 by default) above the clients: a 429 answers at once, and
            # closed-loop clients would spin on it instead of measuring served requests
            key = create_key(gateway.url, "bench", max_concurrent_requests=2 * args.concurrency)
            gateways[(store + label, n)] = (gateway, key)

        async def run_all() -> dict[tuple[str, int], Measured]:
            pooled: dict[tuple[str, int], list[Measured]] = {row: [] for row in gateways}
            for gateway, key in gateways.values():
                await measure(gateway, key, args, 1.5, load)  # warm-up
            for _ in range(args.rounds):
                for row, (gateway, key) in gateways.items():
                    pooled[row].append(await measure(gateway, key, args, args.duration / args.rounds, load))
            return {row: functools.reduce(operator.add, parts) for row, parts in pooled.items()}

        results = asyncio.run(run_all())
    finally:
        for gateway, _ in gateways.values():
            gateway.stop(timeout_s=20)
        for stub in load.stubs:
            stub.stop(timeout_s=10)
        if pool is not None:
            pool.shutdown()

    command = "python -m benchmarks.workers " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    lines = [
        f"`{command.strip()}`  ",
        f"machine: {machine()}, load average {os.getloadavg()[0]:.1f}  ",
        f"{args.concurrency} closed-loop streaming clients (keep-alive), {args.chunks} chunks per answer, "
        f"{args.duration:g}s per row in {args.rounds} alternating rounds; {args.stub_procs} stub and "
        f"{args.client_procs} client process(es)",
        "",
        "| store | workers | requests/s | p50 / p99 latency (ms) | gateway CPU per request (ms, all workers) "
        "| stub / client CPU per request (ms) | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (store, n), measured in results.items():
        phase = measured.phase
        num_requests = max(1, len(phase.latencies_s))
        cpu_ms, stub_ms, client_ms = (cpu / num_requests * 1000
                                      for cpu in (phase.cpu_s, measured.stub_cpu_s, measured.client_cpu_s))
        lines.append(
            f"| {store} | {n} | {phase.rps:.0f} | {phase.pct(0.5):.1f} / {phase.pct(0.99):.1f} | {cpu_ms:.2f} "
            f"| {stub_ms:.2f} / {client_ms:.2f} | {phase.errors} |"
        )
    failed = [(store, n, measured.phase) for (store, n), measured in results.items() if measured.phase.errors]
    if failed:
        lines += ["", "errors by kind (HTTP status or the client's exception), with the first answer of each kind:"]
        for store, n, phase in failed:
            lines.append(f"- {store}, {n} worker(s): {phase.failures_text}")
            lines += [f"  - {kind}: `{sample}`" for kind, sample in phase.samples.items()]
    print("\n".join(lines))
    return 0 if all(measured.phase.errors == 0 for measured in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
