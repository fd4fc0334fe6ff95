"""Where a gateway's CPU per streamed request goes, thread by thread, at a fixed open-loop rate.

    python -m benchmarks.gateway.threads [--rate 800] [--seconds 10] [--rounds 2] [--chunks 8]
                                         [--chunk-delay-ms 0] [--priced] [--tree PATH ...]

Starts the stub backend (tests/gateway/stub_backend.py) and, for each tree (this checkout first, then
each `--tree`, e.g. a `git worktree` of an older commit), `edgerun serve` in front of it as
benchmarks.gateway.overhead does. Then, in `--rounds` rounds with the trees alternating, Poisson
arrivals at `--rate` requests/s stream completions through each gateway's Workers AI route for
`--seconds`, and the CPU time of each of the gateway's threads is read from /proc before and after.
Python 3.11 leaves the OS thread names alone, so threads are shown as "python:<index>" in the order of
their ids: python:0 is the main thread (the event loop), python:1 the first started after it (the
local store's SQLite worker), then the offload pool's as they start. What CPU one thread
costs another (the GIL hand-offs between them) shows up as CPU of the thread that pays it, so a
change that moves work between threads is judged by the total. The figures are per request, in ms.
With several trees, a second table gives each round's CPU per request and, for every tree after the
first, the median and range of its per-round ratio to the first: a difference inside that range is
the machine's noise, not the change.
`--priced` prices the stub's model and gives the tenant a monthly budget, so that every request
reserves and settles its cost as a billed deployment's do (the stub's model is unpriced otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import machine, stat_cpu_s
from benchmarks.gateway.overhead import clients_env
from benchmarks.gateway.raw_load import Phase, drive
from benchmarks.store.ledger import PRICE
from cli.processes import ROOT
from tests.gateway.stub_backend import MODEL_ID, PROMPT, create_key, start_gateway, start_stub


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of each thread of `pid`, by "name:index" (names repeat: each thread's index among those of its name)."""
    found: dict[str, float] = {}
    seen: dict[str, int] = defaultdict(int)
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        task = Path(f"/proc/{pid}/task/{tid}")
        try:
            name, cpu_s = (task / "comm").read_text().strip(), stat_cpu_s(task / "stat")
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        found[f"{name}:{seen[name]}"] = cpu_s
        seen[name] += 1
    return found


def request_body(args: argparse.Namespace) -> dict[str, object]:
    return {"prompt": PROMPT, "max_tokens": args.chunks, "stream": True}


async def measure(url: str, headers: dict[str, str], pid: int, args: argparse.Namespace) -> tuple[Phase, dict[str, float]]:
    """One phase (its requests answered and failed) and each thread's CPU seconds over it."""
    body = request_body(args)
    before = thread_cpu_s(pid)
    phase = await drive("phase", url, body, headers, args.concurrency, args.seconds, pid, args.rate)
    after = thread_cpu_s(pid)
    return phase, {name: after[name] - before.get(name, 0.0) for name in after}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway.threads", description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=800.0, help="requests/s offered (Poisson)")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--chunks", type=int, default=8, help="text chunks the stub streams per request")
    parser.add_argument(
        "--chunk-delay-ms", type=float, default=0.0, help="the stub's pause before each chunk (a decode step)"
    )
    parser.add_argument("--concurrency", type=int, default=50, help="client connections")
    parser.add_argument("--tree", type=Path, action="append", default=[], help="another checkout, measured alike")
    parser.add_argument("--priced", action="store_true", help="a priced model and a tenant budget: every request is billed")
    args = parser.parse_args(argv)
    env = clients_env(args.concurrency)
    if args.priced:
        env["EDGERUN_PRICES"] = json.dumps({MODEL_ID: PRICE})
    tenant: dict[str, object] = {"monthly_budget_micro": 10**15} if args.priced else {}

    trees = [ROOT, *(tree.resolve() for tree in args.tree)]
    stub = start_stub(args.chunks, args.chunk_delay_ms)
    gateways = []
    try:
        workdir = Path(tempfile.mkdtemp(prefix="edgerun-threads-"))
        sides = []
        for i, tree in enumerate(trees):
            gateway = start_gateway(stub.port, workdir / str(i), env, cwd=tree)
            gateways.append(gateway)
            key = create_key(gateway.url, "bench", **tenant)
            url = f"{gateway.url}/client/v4/accounts/bench/ai/run/{MODEL_ID}"
            sides.append((i, url, {"authorization": f"Bearer {key}"}, gateway.process.pid))
        tallies = [Tally() for _ in trees]  # by position in `trees` (one may be named twice, to see the noise)

        async def run() -> None:
            for _, url, headers, _pid in sides:  # warm-up
                await drive("warm-up", url, request_body(args), headers, args.concurrency, 1.5)
            for _ in range(args.rounds):
                for i, url, headers, pid in sides:
                    tallies[i].add(*await measure(url, headers, pid, args))

        asyncio.run(run())
    finally:
        for process in [*gateways, stub]:
            process.stop(timeout_s=15)

    command = "python -m benchmarks.gateway.threads " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"`{command.strip()}`  ")
    print(f"machine: {machine()}, load average {os.getloadavg()[0]:.1f}  ")
    spacing = f" {args.chunk_delay_ms:g} ms before each" if args.chunk_delay_ms else ""
    print(f"{args.rate:g} requests/s offered (Poisson), {args.chunks} chunks per answer{spacing}, {args.rounds} rounds of "
          f"{args.seconds:g}s per tree, alternating")
    print()
    print("| tree | requests | CPU ms per request | by thread (ms per request) |")
    print("| --- | ---: | ---: | --- |")
    for tree, tally in zip(trees, tallies):
        answered = tally.answered
        per = {name: seconds * 1000 / max(1, answered) for name, seconds in tally.cpu_s.items()}
        shown = ", ".join(f"{name} {ms:.3f}" for name, ms in sorted(per.items(), key=lambda kv: -kv[1]) if ms >= 0.005)
        print(f"| {tree} | {answered} | {sum(per.values()):.3f} | {shown} |")
    if len(trees) > 1:
        print_rounds(trees, [tally.round_ms for tally in tallies])
    failed = [(tree, tally.phase) for tree, tally in zip(trees, tallies) if tally.phase and tally.phase.errors]
    for tree, phase in failed:  # CPU per request counts answered requests only: these skew it
        print(f"\nFailed requests through {tree}: {phase.failures_text}")
    return 1 if failed else 0


@dataclass
class Tally:
    """One tree's rounds added up."""

    phase: Phase | None = None  # every round's phase, added (`Phase.__add__`)
    cpu_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))  # by thread
    round_ms: list[float] = field(default_factory=list)  # CPU ms per answered request, round by round

    @property
    def answered(self) -> int:
        return 0 if self.phase is None else len(self.phase.latencies_s)

    def add(self, phase: Phase, cpu_s: dict[str, float]) -> None:
        self.phase = phase if self.phase is None else self.phase + phase
        for name, seconds in cpu_s.items():
            self.cpu_s[name] += seconds
        self.round_ms.append(sum(cpu_s.values()) * 1000 / max(1, len(phase.latencies_s)))


def print_rounds(trees: list[Path], by_round: list[list[float]]) -> None:
    """Each round's CPU ms per request, and each later tree's per-round ratio to the first tree."""
    first = by_round[0]
    print()
    print(f"| tree | CPU ms per request, round by round | per-round ratio to {trees[0]}: median (range) |")
    print("| --- | --- | --- |")
    for i, (tree, rounds) in enumerate(zip(trees, by_round)):
        ratios = [ms / base for ms, base in zip(rounds, first) if base > 0]
        shown = f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})" if i and ratios else ""
        print(f"| {tree} | {' '.join(f'{ms:.3f}' for ms in rounds)} | {shown} |")

if __name__ == "__main__":
    sys.exit(main())
