"""How much the gateway adds: throughput and latency through it vs calling the backend directly.

    python -m benchmarks.gateway_overhead [--concurrency 50] [--duration 10] [--chunks 8] [--rate R]

Starts, as separate processes on loopback, the stub backend (benchmarks/stub_backend.py: answers
at once, real tokenizer work for the gateway) and `edgerun serve` in front of it (embedded store,
one tenant and key made through the admin API). Then `concurrency` closed-loop clients (a lean
raw HTTP/1.1 client, keep-alive) stream completions, straight to the stub and through the
gateway's Workers AI route, interleaved in rounds. The table compares requests/s and latency
percentiles (request sent -> last byte) and shows the gateway's CPU time per request; "added" is
gateway minus direct at the same percentile.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import operator
import shlex
import statistics
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import httpx

from benchmarks import stub_backend
from benchmarks.interleave import interleave
from benchmarks.machine import machine
from benchmarks.raw_load import Phase, drive
from benchmarks.stub_backend import MODEL_ID, PROMPT
from cli.processes import ChildProcess, free_port

ROUNDS = 4
ADMIN_TOKEN = "bench-admin-token-0123456789abcdefghij"  # settings want >= 32 characters


def start_stub(num_chunks: int) -> ChildProcess:
    port = free_port()
    stub = ChildProcess.launch("stub", stub_backend.command(port, num_chunks), port)
    stub.wait_ready("/health")
    return stub


def start_gateway(stub_port: int, workdir: Path, env: Mapping[str, str] | None = None) -> ChildProcess:
    """`edgerun serve` with the embedded store under `workdir`, the stub as its one backend; `env` adds or overrides."""
    settings = {
        "EDGERUN_SQLITE_PATH": str(workdir / "gateway.sqlite3"),
        "EDGERUN_ADMIN_TOKEN": ADMIN_TOKEN,
        "EDGERUN_TOKENIZER_CACHE_DIR": str(workdir / "tokenizers"),
        "EDGERUN_LOG_LEVEL": "warning",
        **stub_backend.gateway_env(stub_port),
        **(env or {}),
    }
    gateway = ChildProcess.spawn("gateway", "serve", env=settings)
    gateway.wait_ready("/healthz")
    return gateway


def create_key(base: str, account: str, **tenant: object) -> str:
    """A new tenant owning `account` (extra `tenant` fields as the admin API takes them) and its API key."""
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    body = {"name": "bench", "account_ids": [account], **tenant}
    created = httpx.post(f"{base}/admin/v1/tenants", json=body, headers=admin).json()["result"]
    return httpx.post(f"{base}/admin/v1/tenants/{created['id']}/keys", json={}, headers=admin).json()["result"]["secret"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--chunks", type=int, default=8, help="text chunks the stub streams per request")
    parser.add_argument(
        "--rate", type=float, help="requests/s offered in all (Poisson arrivals) instead of a closed loop"
    )
    args = parser.parse_args(argv)

    stub = start_stub(args.chunks)
    gateway = None
    try:
        gateway = start_gateway(stub.port, Path(tempfile.mkdtemp(prefix="edgerun-bench-")))
        key = create_key(gateway.url, "bench")
        direct_url = f"{stub.url}/v1/completions"
        direct_body = {"model": "stub", "prompt": list(range(40)), "max_tokens": args.chunks, "stream": True}
        gateway_url = f"{gateway.url}/client/v4/accounts/bench/ai/run/{MODEL_ID}"
        gateway_body = {"prompt": PROMPT, "max_tokens": args.chunks, "stream": True}
        auth = {"authorization": f"Bearer {key}"}
        pid = gateway.process.pid

        async def run_all() -> tuple[Phase, Phase]:
            await drive("warm-up", gateway_url, gateway_body, auth, args.concurrency, 2.0)
            await drive("warm-up", direct_url, direct_body, {}, args.concurrency, 1.0)
            slice_s = args.duration / ROUNDS
            paired = await interleave(
                lambda: drive("direct", direct_url, direct_body, {}, args.concurrency, slice_s, rate=args.rate),
                lambda: drive("gateway", gateway_url, gateway_body, auth, args.concurrency, slice_s, pid, args.rate),
                ROUNDS,
            )
            return functools.reduce(operator.add, paired.baseline), functools.reduce(operator.add, paired.subject)

        direct, through = asyncio.run(run_all())
    finally:
        for process in (gateway, stub):
            if process is not None:
                process.stop(timeout_s=15)

    command = "python -m benchmarks.gateway_overhead " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    print(report(direct, through, args, command.strip()))
    return 0 if through.errors == 0 else 1


def report(direct: Phase, through: Phase, args: argparse.Namespace, command: str) -> str:
    rows = [
        ("requests/s", f"{direct.rps:.0f}", f"{through.rps:.0f}", ""),
        *(
            (
                f"latency p{int(q * 100)} (ms)",
                f"{direct.pct(q):.2f}",
                f"{through.pct(q):.2f}",
                f"{through.pct(q) - direct.pct(q):+.2f}",
            )
            for q in (0.5, 0.9, 0.99)
        ),
        (
            "mean latency (ms)",
            f"{statistics.fmean(direct.latencies_s) * 1000:.2f}",
            f"{statistics.fmean(through.latencies_s) * 1000:.2f}",
            "",
        ),
        (
            "requests (errors)",
            f"{len(direct.latencies_s)} ({direct.errors})",
            f"{len(through.latencies_s)} ({through.errors})",
            "",
        ),
        ("gateway CPU per request (ms)", "", f"{through.cpu_s / max(1, len(through.latencies_s)) * 1000:.2f}", ""),
    ]
    lines = [
        f"`{command}`  ",
        f"machine: {machine()}  ",
        f"{args.concurrency} concurrent streaming clients "
        f"({'closed loop' if args.rate is None else f'{args.rate:g} requests/s offered, Poisson'}, keep-alive), "
        f"{args.chunks} chunks per answer, "
        f"{args.duration:g}s through the gateway and {args.duration:g}s direct, alternating in {ROUNDS} rounds",
        "",
        "| metric | direct to stub | through gateway | added |",
        "| --- | ---: | ---: | ---: |",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
