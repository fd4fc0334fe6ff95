"""How much the gateway adds: throughput and latency through it vs calling the backend directly.

    python -m benchmarks.gateway_overhead [--concurrency 50] [--duration 10] [--chunks 8]
                                          [--rate R|half] [--baseline-tree PATH]

Starts, as separate processes on loopback, the stub backend (benchmarks/stub_backend.py: answers
at once, real tokenizer work for the gateway) and `edgerun serve` in front of it (embedded store,
one tenant and key made through the admin API). Then `concurrency` closed-loop clients (a lean
raw HTTP/1.1 client, keep-alive) stream completions, straight to the stub and through the
gateway's Workers AI route, interleaved in rounds. The table compares requests/s and latency
percentiles (request sent -> last byte) and shows the gateway's CPU time per request; "added" is
gateway minus direct at the same percentile. `--baseline-tree` runs a second gateway from another
checkout (e.g. `git worktree add /tmp/base main`) in the same rounds: before and after on the
same machine at the same time. `--rate half` measures the gateway's closed-loop capacity first,
then offers half of it as Poisson arrivals to every side (latency counted from each arrival).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import operator
import os
import shlex
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks import stub_backend
from benchmarks.machine import machine
from benchmarks.raw_load import Phase, drive
from benchmarks.stub_backend import MODEL_ID, PROMPT
from cli.processes import ROOT, ChildProcess, free_port

ROUNDS = 4
ADMIN_TOKEN = "bench-admin-token-0123456789abcdefghij"  # settings want >= 32 characters


def start_stub(num_chunks: int) -> ChildProcess:
    port = free_port()
    stub = ChildProcess.launch("stub", stub_backend.command(port, num_chunks), port)
    stub.wait_ready("/health")
    return stub


def start_gateway(
    stub_port: int,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    *,
    cwd: Path = ROOT,
    args: Sequence[str] = (),
) -> ChildProcess:
    """`edgerun serve` with the embedded store under `workdir`, the stub as its one backend; `env` adds or
    overrides; `cwd`: the checkout it runs from (a baseline); `args`: more `edgerun serve` options."""
    workdir.mkdir(parents=True, exist_ok=True)
    settings = {
        "EDGERUN_SQLITE_PATH": str(workdir / "gateway.sqlite3"),
        "EDGERUN_ADMIN_TOKEN": ADMIN_TOKEN,
        "EDGERUN_TOKENIZER_CACHE_DIR": str(workdir / "tokenizers"),
        "EDGERUN_LOG_LEVEL": "warning",
        **stub_backend.gateway_env(stub_port),
        **(env or {}),
    }
    gateway = ChildProcess.spawn("gateway", "serve", args, env=settings, cwd=cwd)
    gateway.wait_ready("/healthz")
    return gateway


def create_key(base: str, account: str, **tenant: object) -> str:
    """A new tenant owning `account` (extra `tenant` fields as the admin API takes them) and its API key."""
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    body = {"name": "bench", "account_ids": [account], **tenant}
    created = httpx.post(f"{base}/admin/v1/tenants", json=body, headers=admin).json()["result"]
    return httpx.post(f"{base}/admin/v1/tenants/{created['id']}/keys", json={}, headers=admin).json()["result"]["secret"]


@dataclass(slots=True)
class Side:
    """One thing measured: the stub directly, this tree's gateway, or a baseline tree's gateway."""

    name: str
    url: str
    body: dict[str, object]
    headers: dict[str, str]
    pid: int | None = None  # the gateway process whose CPU is counted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--chunks", type=int, default=8, help="text chunks the stub streams per request")
    parser.add_argument(
        "--rate",
        help="requests/s offered in all (Poisson arrivals) instead of a closed loop; 'half': half the gateway's "
        "capacity, measured first with closed-loop clients",
    )
    parser.add_argument(
        "--baseline-tree", type=Path, help="another checkout whose gateway runs too, in the same rounds (before/after)"
    )
    args = parser.parse_args(argv)

    stub = start_stub(args.chunks)
    gateways: list[ChildProcess] = []
    try:
        workdir = Path(tempfile.mkdtemp(prefix="edgerun-bench-"))
        sides = [
            Side(
                "direct",
                f"{stub.url}/v1/completions",
                {"model": "stub", "prompt": list(range(40)), "max_tokens": args.chunks, "stream": True},
                {},
            )
        ]
        trees = [("gateway", ROOT)] + ([("baseline", args.baseline_tree.resolve())] if args.baseline_tree else [])
        for name, tree in trees:
            gateway = start_gateway(stub.port, workdir / name, cwd=tree)
            gateways.append(gateway)
            key = create_key(gateway.url, "bench")
            url = f"{gateway.url}/client/v4/accounts/bench/ai/run/{MODEL_ID}"
            body = {"prompt": PROMPT, "max_tokens": args.chunks, "stream": True}
            sides.append(Side(name, url, body, {"authorization": f"Bearer {key}"}, gateway.process.pid))
        phases, rate, capacity = asyncio.run(run_rounds(sides, args))
    finally:
        for process in [*gateways, stub]:
            process.stop(timeout_s=15)

    command = "python -m benchmarks.gateway_overhead " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    print(report(phases, args, command.strip(), rate, capacity))
    return 0 if all(phase.errors == 0 for phase in phases[1:]) else 1


async def run_rounds(sides: list[Side], args: argparse.Namespace) -> tuple[list[Phase], float | None, float | None]:
    """Each side once per round, `ROUNDS` rounds; with `--rate half` the gateway's closed-loop
    capacity is measured first. Returns each side's pooled phase, the rate used and the capacity."""
    for side in sides:
        await drive("warm-up", side.url, side.body, side.headers, args.concurrency, 1.5)
    capacity = None
    rate = None if args.rate is None or args.rate == "half" else float(args.rate)
    if args.rate == "half":
        gateway = sides[1]
        measured = await drive("capacity", gateway.url, gateway.body, gateway.headers, args.concurrency, 4.0)
        capacity = measured.rps
        rate = capacity / 2
    slice_s = args.duration / ROUNDS
    pooled: list[list[Phase]] = [[] for _ in sides]
    for _ in range(ROUNDS):
        for i, side in enumerate(sides):
            phase = await drive(side.name, side.url, side.body, side.headers, args.concurrency, slice_s, side.pid, rate)
            pooled[i].append(phase)
    return [functools.reduce(operator.add, phases) for phases in pooled], rate, capacity


def _cpu_ms(phase: Phase) -> str:
    return f"{phase.cpu_s / max(1, len(phase.latencies_s)) * 1000:.2f}"


def report(
    phases: list[Phase], args: argparse.Namespace, command: str, rate: float | None, capacity: float | None
) -> str:
    direct, *gateways = phases
    names = {"gateway": "through gateway", "baseline": "through baseline gateway"}
    added = ["added"] if len(gateways) == 1 else [f"added ({g.name})" for g in gateways]
    header = ["metric", "direct to stub", *(names[g.name] for g in gateways), *added]
    rows = [
        ["requests/s", *(f"{p.rps:.0f}" for p in phases), *("" for _ in gateways)],
        *(
            [
                f"latency p{int(q * 100)} (ms)",
                *(f"{p.pct(q):.2f}" for p in phases),
                *(f"{g.pct(q) - direct.pct(q):+.2f}" for g in gateways),
            ]
            for q in (0.5, 0.9, 0.99)
        ),
        [
            "mean latency (ms)",
            *(f"{statistics.fmean(p.latencies_s) * 1000:.2f}" for p in phases),
            *("" for _ in gateways),
        ],
        ["requests (errors)", *(f"{len(p.latencies_s)} ({p.errors})" for p in phases), *("" for _ in gateways)],
        ["gateway CPU per request (ms)", "", *(_cpu_ms(g) for g in gateways), *("" for _ in gateways)],
    ]
    if rate is None:
        load = "closed loop"
    elif capacity is not None:
        load = f"{rate:.0f} requests/s offered, Poisson: half the gateway's closed-loop capacity of {capacity:.0f}/s"
    else:
        load = f"{rate:g} requests/s offered, Poisson"
    lines = [
        f"`{command}`  ",
        f"machine: {machine()}, load average {os.getloadavg()[0]:.1f}  ",
        f"{args.concurrency} concurrent streaming clients ({load}, keep-alive), {args.chunks} chunks per answer, "
        f"{args.duration:g}s per side, the sides alternating in {ROUNDS} rounds",
        "",
        "| " + " | ".join(header) + " |",
        "| --- |" + " ---: |" * (len(header) - 1),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
