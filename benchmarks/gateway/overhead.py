"""How much the gateway adds: throughput and latency through it vs calling the backend directly.

    python -m benchmarks.gateway.overhead [--concurrency 50] [--duration 10] [--chunks 8] [--chunk-delay-ms 0]
                                          [--rate R|half] [--baseline-tree PATH] [--router sglang] [--quickack]
                                          [--chat]

Starts, as separate processes on loopback, the stub backend (tests/gateway/stub_backend.py: answers
at once, or with `--chunk-delay-ms` between its chunks as a model's decode steps space them, so that
each chunk reaches the gateway in a read of its own; real tokenizer work for the gateway) and
`edgerun serve` in front of it (local store, one tenant and key made through the admin API).
Then `concurrency` closed-loop clients (a lean raw HTTP/1.1 client, keep-alive) stream completions,
straight to the stub and through the gateway's Workers AI route, interleaved in rounds. The table
compares requests/s and latency percentiles (request sent -> last byte) and shows the gateway's CPU
time per request; "added" is gateway minus direct at the same percentile. `--baseline-tree` runs a
second gateway from another checkout (e.g. `git worktree add /tmp/base main`) in the same rounds:
before and after on the same machine at the same time. `--router sglang` adds the SGLang model gateway's Rust router
(benchmarks/gateway/sglang_router.py, installed into its own environment on first use) in front of the
same stub: streamed OpenAI chat completions through it to the stub's /v1/chat/completions, with
the stub's chat route called directly as its "direct" side, and the ratio of the gateway's CPU per
request to the router's. The router only forwards: edgerun also authenticates, rate-limits,
applies the chat template, tokenizes, routes by prefix and bills. sglang-router 0.3.2 leaves
Nagle's algorithm on for its clients' connections, so on a keep-alive connection the rest of a
stream waits for the client's delayed ACK (~40 ms on Linux); `--quickack` makes every client
acknowledge at once (TCP_QUICKACK, on every side alike), which measures the router without that
stall. `--chat`: the gateways too get OpenAI chat completions (their /ai/v1/chat/completions route)
instead of Workers AI's `ai/run` with a prompt. `--rate half` measures the
gateway's closed-loop capacity first (and the router's, taking the slower), then offers half of
it as Poisson arrivals to every side (latency counted from each arrival).
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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import machine
from benchmarks.gateway import sglang_router
from benchmarks.gateway.raw_load import Phase, drive
from cli.processes import ROOT, ChildProcess
from tests.gateway.stub_backend import MODEL_ID, PROMPT, create_key, start_gateway, start_stub

ROUNDS = 4


def clients_env(concurrency: int) -> dict[str, str]:
    """A gateway's setting for `concurrency` benchmark clients: they all connect from one loopback
    address, and the per-client bound (64 connections) would answer the rest 503. Twice as many: a
    phase's connections may still be closing while the next phase's open."""
    return {"EDGERUN_MAX_CONNECTIONS_PER_CLIENT": str(max(64, 2 * concurrency))}


@dataclass(slots=True)
class Side:
    """One thing measured: the stub directly, this tree's gateway, or a baseline tree's gateway."""

    name: str
    url: str
    body: dict[str, object]
    headers: dict[str, str]
    pid: int | None = None  # the gateway process whose CPU is counted


# What each side is called in the report, and which direct side its added latency is taken against.
TITLES = {
    "direct": "direct to stub",
    "direct-chat": "direct to stub (chat)",
    "gateway": "through gateway",
    "baseline": "through baseline gateway",
    "router": "through SGLang router",
}
REFERENCE = {"gateway": "direct", "baseline": "direct", "router": "direct-chat"}


def chat_body(model: str, num_chunks: int) -> dict[str, object]:
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": num_chunks, "stream": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway.overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--chunks", type=int, default=8, help="text chunks the stub streams per request")
    parser.add_argument(
        "--chunk-delay-ms", type=float, default=0.0, help="the stub's pause before each chunk (a decode step)"
    )
    parser.add_argument(
        "--rate",
        help="requests/s offered in all (Poisson arrivals) instead of a closed loop; 'half': half the gateway's "
        "capacity, measured first with closed-loop clients",
    )
    parser.add_argument(
        "--baseline-tree", type=Path, help="another checkout whose gateway runs too, in the same rounds (before/after)"
    )
    parser.add_argument(
        "--router",
        choices=["sglang"],
        help=f"a router in front of the same stub, in the same rounds: sglang-router=={sglang_router.VERSION}",
    )
    parser.add_argument(
        "--quickack",
        action="store_true",
        help="clients acknowledge each read at once (a server streaming with Nagle's algorithm on does not stall)",
    )
    parser.add_argument(
        "--chat", action="store_true", help="the gateways' OpenAI chat completions route instead of Workers AI's ai/run"
    )
    args = parser.parse_args(argv)

    stub = start_stub(args.chunks, args.chunk_delay_ms)
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
            gateway = start_gateway(stub.port, workdir / name, clients_env(args.concurrency), cwd=tree)
            gateways.append(gateway)
            key = create_key(gateway.url, "bench")
            if args.chat:
                url = f"{gateway.url}/client/v4/accounts/bench/ai/v1/chat/completions"
                body = chat_body(MODEL_ID, args.chunks)
            else:
                url = f"{gateway.url}/client/v4/accounts/bench/ai/run/{MODEL_ID}"
                body = {"prompt": PROMPT, "max_tokens": args.chunks, "stream": True}
            sides.append(Side(name, url, body, {"authorization": f"Bearer {key}"}, gateway.process.pid))
        if args.router == "sglang":
            router = sglang_router.start([stub.url])
            gateways.append(router)
            body = chat_body("stub", args.chunks)
            sides.insert(1, Side("direct-chat", f"{stub.url}/v1/chat/completions", body, {}))
            sides.append(Side("router", f"{router.url}/v1/chat/completions", body, {}, router.process.pid))
        phases, rate, capacities = asyncio.run(run_rounds(sides, args))
    finally:
        for process in [*gateways, stub]:
            process.stop(timeout_s=15)

    command = "python -m benchmarks.gateway.overhead " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    print(report(phases, args, command.strip(), rate, capacities))
    return 0 if all(phase.errors == 0 for phase in phases if phase.name != "direct") else 1


async def run_rounds(sides: list[Side], args: argparse.Namespace) -> tuple[list[Phase], float | None, dict[str, float]]:
    """Each side once per round, `ROUNDS` rounds; with `--rate half` the closed-loop capacity of
    the gateway (and of the router, if there is one) is measured first. Returns each side's pooled
    phase, the rate used and the capacities measured (requests/s by side)."""
    for side in sides:
        await drive("warm-up", side.url, side.body, side.headers, args.concurrency, 1.5, quickack=args.quickack)
    capacities: dict[str, float] = {}
    rate = None if args.rate is None or args.rate == "half" else float(args.rate)
    if args.rate == "half":
        for side in sides:
            if side.name in ("gateway", "router"):
                measured = await drive(
                    "capacity", side.url, side.body, side.headers, args.concurrency, 4.0, quickack=args.quickack
                )
                capacities[side.name] = measured.rps
        rate = min(capacities.values()) / 2
    slice_s = args.duration / ROUNDS
    pooled: list[list[Phase]] = [[] for _ in sides]
    for _ in range(ROUNDS):
        for i, side in enumerate(sides):
            phase = await drive(
                side.name, side.url, side.body, side.headers, args.concurrency, slice_s, side.pid, rate, args.quickack
            )
            pooled[i].append(phase)
    return [functools.reduce(operator.add, phases) for phases in pooled], rate, capacities


def cpu_per_request_ms(phase: Phase) -> float:
    return phase.cpu_s / max(1, len(phase.latencies_s)) * 1000


def report(
    phases: list[Phase], args: argparse.Namespace, command: str, rate: float | None, capacities: Mapping[str, float]
) -> str:
    by_name = {p.name: p for p in phases}
    fronts = [p for p in phases if p.name in REFERENCE]
    blanks = ["" for _ in fronts]
    added = ["added"] if len(fronts) == 1 else [f"added ({g.name})" for g in fronts]
    header = ["metric", *(TITLES[p.name] for p in phases), *added]
    rows = [
        ["requests/s", *(f"{p.rps:.0f}" for p in phases), *blanks],
        *(
            [
                f"latency p{int(q * 100)} (ms)",
                *(f"{p.pct(q):.2f}" for p in phases),
                *(f"{g.pct(q) - by_name[REFERENCE[g.name]].pct(q):+.2f}" for g in fronts),
            ]
            for q in (0.5, 0.9, 0.99)
        ),
        ["mean latency (ms)", *(f"{statistics.fmean(p.latencies_s) * 1000:.2f}" for p in phases), *blanks],
        ["requests (errors)", *(f"{len(p.latencies_s)} ({p.errors})" for p in phases), *blanks],
        [
            "gateway CPU per request (ms)",
            *(f"{cpu_per_request_ms(p):.2f}" if p.name in REFERENCE else "" for p in phases),
            *blanks,
        ],
    ]
    if rate is None:
        load = "closed loop"
    elif len(capacities) == 1:
        (capacity,) = capacities.values()
        load = f"{rate:.0f} requests/s offered, Poisson: half the gateway's closed-loop capacity of {capacity:.0f}/s"
    elif capacities:
        measured = ", ".join(f"{name} {rps:.0f}/s" for name, rps in capacities.items())
        load = f"{rate:.0f} requests/s offered, Poisson: half the slower closed-loop capacity ({measured})"
    else:
        load = f"{rate:g} requests/s offered, Poisson"
    connections = "keep-alive, TCP_QUICKACK" if args.quickack else "keep-alive"
    spacing = f" {args.chunk_delay_ms:g} ms before each" if args.chunk_delay_ms else ""
    lines = [
        f"`{command}`  ",
        f"machine: {machine()}, load average {os.getloadavg()[0]:.1f}  ",
        f"{args.concurrency} concurrent streaming clients ({load}, {connections}), {args.chunks} chunks per answer"
        f"{spacing}, {args.duration:g}s per side, the sides alternating in {ROUNDS} rounds",
        "",
        "| " + " | ".join(header) + " |",
        "| --- |" + " ---: |" * (len(header) - 1),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]
    failed = [p for p in phases if p.errors]
    if failed:
        lines += ["", "Failed requests (each kind's first answer): " + "; ".join(map(failed_text, failed))]
    if "router" in by_name:
        lines += ["", against_router(by_name)]
    return "\n".join(lines)


def failed_text(phase: Phase) -> str:
    """What a phase's failed requests got, most frequent first, each with the first answer of its kind."""
    answers = ", ".join(f"{kind}: {phase.samples.get(kind, '')[:80]!r}" for kind, _ in phase.failures.most_common())
    return f"{TITLES[phase.name]}: {phase.failures_text} ({answers})"


def against_router(by_name: Mapping[str, Phase]) -> str:
    """One line: each edgerun gateway's CPU per request and requests/s as multiples of the router's."""
    router = by_name["router"]
    router_cpu = cpu_per_request_ms(router)
    parts = [
        f"{name} {cpu_per_request_ms(by_name[name]) / router_cpu:.2f}x the CPU per request, "
        f"{by_name[name].rps / router.rps:.2f}x the requests/s"
        for name in ("gateway", "baseline")
        if name in by_name and router_cpu > 0
    ]
    return "Against the SGLang router (edgerun / router): " + ("; ".join(parts) or "router CPU not measured")


if __name__ == "__main__":
    sys.exit(main())
