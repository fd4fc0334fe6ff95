"""Throughput and CPU per request of `edgerun serve --workers N` for several N, in one run.

    python -m benchmarks.gateway.workers [--workers 1 2 4] [--stores redis sqlite local] [--concurrency 50]
        [--duration 12] [--chunks 8] [--stub-procs 1] [--client-procs 1] [--baseline-tree PATH]

Starts the stub backend (tests/gateway/stub_backend.py) and, for each store and N, `edgerun serve
--workers N` in front of it: `redis` (`--redis-url`, a fresh key prefix per gateway; `--redis-url
private` starts a redis-server of this script's on a Unix socket, nothing written to disk, and counts
its CPU as the gateway's), `sqlite` (the local store's file shared by the workers, the default
without Redis: gateway/store/local/shared.py) and `local` (the one-process store, N=1 only: the
baseline the shared modes cost against). N=1 uses the shared store too (`sqlite_shared = true`), so
the rows of one store differ only in the number of processes. `concurrency` closed-loop
keep-alive clients (a lean raw HTTP/1.1 client, benchmarks/gateway/raw_load.py) stream completions; the
kernel spreads their connections over the workers (SO_REUSEPORT). CPU is summed over every
worker process. The rows alternate in `--rounds` rounds, each gateway started once and kept.
On a machine with many cores, `--stub-procs` stub processes share the stub's port (SO_REUSEPORT) and
`--client-procs` processes share the clients, so neither the stub nor the load generator is what
saturates first; their CPU per request is reported beside the gateway's. `--baseline-tree` runs
each row's gateway from another checkout too (rows marked "baseline"), in the same rounds: before/after
.
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
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.common import machine, process_cpu_s
from benchmarks.gateway.raw_load import Phase, drive
from cli.processes import ROOT, ChildProcess, free_port
from tests.gateway import stub_backend
from tests.gateway.stub_backend import MODEL_ID, PROMPT, create_key, start_gateway
from tests.process_tree import gateway_pids


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


@dataclass
class Gateway:
    """One row's gateway, its tenant's key, and the private redis-server its CPU is counted with (if any)."""

    process: ChildProcess
    key: str
    redis_pid: int | None = None

    def pids(self) -> list[int]:
        """Every process of the gateway: its workers, and the private redis-server."""
        return gateway_pids(self.process.process.pid) + ([self.redis_pid] if self.redis_pid else [])

    def stop(self) -> None:
        self.process.stop(timeout_s=20)


def start_private_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server on a Unix socket in `workdir` (nothing written to disk), as `serve --workers N`
    could start for its workers; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not installed (`make install` installs it)")
    workdir.mkdir(parents=True, exist_ok=True)
    socket = workdir / "redis.sock"
    server = subprocess.Popen([binary, "--port", "0", "--unixsocket", str(socket), "--unixsocketperm", "700",
                               "--save", "", "--appendonly", "no", "--dir", str(workdir)], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while not socket.exists():
        if time.monotonic() > deadline or server.poll() is not None:
            raise SystemExit("redis-server did not start")
        time.sleep(0.02)
    return server, f"unix://{socket}"


@dataclass
class Measured:
    phase: Phase  # the clients' requests; cpu_s: the gateway's (all workers, and a private redis-server)
    stub_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    redis_cpu_s: float | None = None  # the private redis-server's part of phase.cpu_s; None: none

    def __add__(self, other: Measured) -> Measured:
        redis = None if self.redis_cpu_s is None or other.redis_cpu_s is None else self.redis_cpu_s + other.redis_cpu_s
        return Measured(self.phase + other.phase, self.stub_cpu_s + other.stub_cpu_s,
                        self.client_cpu_s + other.client_cpu_s, redis)


async def measure(gateway: Gateway, args: argparse.Namespace, slice_s: float, load: Load) -> Measured:
    url = f"{gateway.process.url}/client/v4/accounts/bench/ai/run/{MODEL_ID}"
    body = {"prompt": PROMPT, "max_tokens": args.chunks, "stream": True}
    headers = {"authorization": f"Bearer {gateway.key}"}
    pids = gateway.pids()
    redis_pid = gateway.redis_pid
    redis_before = process_cpu_s(redis_pid) if redis_pid else 0.0
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
    redis_cpu = process_cpu_s(redis_pid) - redis_before if redis_pid else None
    return Measured(phase, sum(process_cpu_s(pid) for pid in stub_pids) - stub_before, client_cpu, redis_cpu)


def store_env(store: str, redis_url: str) -> dict[str, str]:
    """The settings of each store measured: Redis (a fresh key prefix), the SQLite file shared by
    the workers, or nothing: (one process only) the local store's in-memory fast path."""
    if store == "redis":
        return {"EDGERUN_REDIS_URL": redis_url, "EDGERUN_KEY_PREFIX": f"edgerun-bench:{uuid.uuid4().hex[:8]}:"}
    return {"EDGERUN_SQLITE_SHARED": "true"} if store == "sqlite" else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway.workers", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--stores", nargs="+", choices=["redis", "sqlite", "local"], default=["redis", "sqlite"],
                        help="shared stores measured at each N; local: the one-process store, at N=1 only")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--duration", type=float, default=12.0, help="seconds per row in all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0",
                        help="the Redis of the redis rows; 'private': a redis-server this script starts (its CPU counted)")
    parser.add_argument("--stub-procs", type=int, default=1, help="stub backend processes sharing its port")
    parser.add_argument("--client-procs", type=int, default=1,
                        help="load generator processes (1: the clients run in this process)")
    parser.add_argument("--baseline-tree", type=Path,
                        help="another checkout whose gateways run too, in the same rounds (before/after)")
    args = parser.parse_args(argv)
    if args.stub_procs < 1 or not 1 <= args.client_procs <= args.concurrency:
        parser.error("--stub-procs must be >= 1 and --client-procs between 1 and --concurrency")

    trees = [("", ROOT)] + ([(" (baseline)", args.baseline_tree.resolve())] if args.baseline_tree else [])
    rows = [(store, n, label, tree) for store in args.stores for n in args.workers if store != "local" or n == 1
            for label, tree in trees]
    pool = None
    if args.client_procs > 1:
        pool = ProcessPoolExecutor(args.client_procs, mp_context=multiprocessing.get_context("spawn"))
    load = Load(start_stubs(args.chunks, args.stub_procs), pool)
    gateways: dict[tuple[str, int], Gateway] = {}  # (store and tree, N) -> gateway
    workdir = Path(tempfile.mkdtemp(prefix="edgerun-workers-"))
    private_redis: subprocess.Popen[bytes] | None = None
    redis_url = args.redis_url
    if args.redis_url == "private" and "redis" in args.stores:
        private_redis, redis_url = start_private_redis(workdir / "redis")
    try:
        for store, n, label, tree in rows:
            # every client connects from 127.0.0.1: a listener's per-address connection cap (64) must hold them all,
            # or the connections past it are answered 503 and closed, and closed-loop clients spin on that
            env = {**store_env(store, redis_url), "EDGERUN_MAX_CONNECTIONS_PER_CLIENT": str(args.concurrency)}
            row_dir = workdir / f"{store}-{n}{label.strip(' ()')}"
            process = start_gateway(load.stubs[0].port, row_dir, env, cwd=tree, args=["--workers", str(n)])
            # the tenant's in-flight limit (128 by default) above the clients: a 429 answers at once, and
            # closed-loop clients would spin on it instead of measuring served requests
            key = create_key(process.url, "bench", max_concurrent_requests=2 * args.concurrency)
            redis_pid = private_redis.pid if private_redis is not None and store == "redis" else None
            gateways[(store + label, n)] = Gateway(process, key, redis_pid)

        async def run_all() -> dict[tuple[str, int], Measured]:
            pooled: dict[tuple[str, int], list[Measured]] = {row: [] for row in gateways}
            for gateway in gateways.values():
                await measure(gateway, args, 1.5, load)  # warm-up
            for _ in range(args.rounds):
                for row, gateway in gateways.items():
                    pooled[row].append(await measure(gateway, args, args.duration / args.rounds, load))
            return {row: functools.reduce(operator.add, parts) for row, parts in pooled.items()}

        results = asyncio.run(run_all())
    finally:
        for gateway in gateways.values():
            gateway.stop()
        for stub in load.stubs:
            stub.stop(timeout_s=10)
        if pool is not None:
            pool.shutdown()
        if private_redis is not None:
            private_redis.terminate()
            private_redis.wait(timeout=30)

    command = "python -m benchmarks.gateway.workers " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    lines = [
        f"`{command.strip()}`  ",
        f"machine: {machine()}, load average {os.getloadavg()[0]:.1f}  ",
        f"{args.concurrency} closed-loop streaming clients (keep-alive), {args.chunks} chunks per answer, "
        f"{args.duration:g}s per row in {args.rounds} alternating rounds; {args.stub_procs} stub and "
        f"{args.client_procs} client process(es)",
        "",
        "| store | workers | requests/s | p50 / p99 latency (ms) | gateway CPU per request (ms, all workers and a "
        "private redis-server) | of which redis-server (ms) | stub / client CPU per request (ms) | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for (store, n), measured in results.items():
        phase = measured.phase
        num_requests = max(1, len(phase.latencies_s))
        cpu_ms, stub_ms, client_ms = (cpu / num_requests * 1000
                                      for cpu in (phase.cpu_s, measured.stub_cpu_s, measured.client_cpu_s))
        redis_ms = "-" if measured.redis_cpu_s is None else f"{measured.redis_cpu_s / num_requests * 1000:.2f}"
        lines.append(
            f"| {store} | {n} | {phase.rps:.0f} | {phase.pct(0.5):.1f} / {phase.pct(0.99):.1f} | {cpu_ms:.2f} "
            f"| {redis_ms} | {stub_ms:.2f} / {client_ms:.2f} | {phase.errors} |"
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
