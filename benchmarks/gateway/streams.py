"""Thousands of open streams through one gateway process: errors, memory per stream, fairness.

    python -m benchmarks.gateway.streams --streams 1000 [--hold 15] [--chunks 15] [--clients 4]

Starts, as separate processes on loopback, the stub backend streaming `--chunks` chunks spread
over `--hold` seconds (tests/gateway/stub_backend.py `--chunk-delay-ms`) and `edgerun serve` in
front of it, then opens `--streams` streaming requests at once from `--clients` client processes
(so the load generator is not what limits), each connection from its own loopback source address
in turns of `--per-address` (127.0.0.2, 127.0.0.3, ...: the gateway's per-address connection cap
applies as it would to real clients). Every stream is read to its end on a raw socket.

Reported: status of every stream (all must be 200 with every chunk and `[DONE]`), how many were
open at the same moment, the gateway's RSS idle and at its peak (and the difference per open
stream), its CPU, and per-stream progress: time to first chunk, chunks per second and the
longest gap between two chunks, as percentiles over the streams (fair progress: the slowest
stream's rate close to the median's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shlex
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import machine, process_cpu_s
from benchmarks.gateway.raw_load import raw_request
from cli.processes import ChildProcess, free_port
from tests.gateway import stub_backend
from tests.gateway.stub_backend import MODEL_ID, PROMPT, create_key, start_gateway


@dataclass(slots=True)
class StreamResult:
    status: int  # 0: no answer (connection failed)
    error: str
    num_events: int
    done: bool  # `[DONE]` arrived
    started: float  # time.monotonic(), the same clock in every process on Linux
    first_chunk: float | None
    ended: float
    max_gap_s: float


async def one_stream(host: str, port: int, request: bytes, source: str) -> StreamResult:
    started = time.monotonic()
    status, error, events, done, first, last, max_gap = 0, "", 0, False, None, started, 0.0
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        buffer = b""
        while not done:
            chunk = await reader.read(65536)
            if not chunk:
                break
            now = time.monotonic()
            num_new = chunk.count(b"data: ")
            if num_new:
                if first is None:
                    first = now
                else:
                    max_gap = max(max_gap, now - last)
                last = now
                events += num_new
            buffer = (buffer + chunk)[-64:]
            done = b"data: [DONE]" in buffer
        if status != 200:
            error = f"HTTP {status}: {buffer[-60:]!r}"
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        error = f"{type(exc).__name__}: {exc}"
    finally:
        if writer is not None:
            writer.close()
    return StreamResult(status, error, events, done, started, first, time.monotonic(), max_gap)


def client_process(
    url: str, body: dict[str, object], key: str, sources: list[str], start_at: float
) -> list[StreamResult]:
    """One load-generator process: one stream per entry of `sources`, all opened at `start_at`."""
    host, port, request = raw_request(url, body, {"authorization": f"Bearer {key}"})

    async def run() -> list[StreamResult]:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        return await asyncio.gather(*(one_stream(host, port, request, source) for source in sources))

    return asyncio.run(run())


def source_addresses(num_streams: int, per_address: int) -> list[str]:
    """127.0.0.2, ... in turns of `per_address` (loopback answers the whole 127/8 on Linux)."""
    addresses = []
    for i in range(num_streams):
        n = 2 + i // per_address
        addresses.append(f"127.{n // 65536 % 256}.{n // 256 % 256}.{n % 256}")
    return addresses


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def max_open(results: list[StreamResult]) -> int:
    """The most streams open at one moment (connected, not yet ended)."""
    edges = sorted([(r.started, 1) for r in results] + [(r.ended, -1) for r in results])
    best = current = 0
    for _, change in edges:
        current += change
        best = max(best, current)
    return best


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway.streams", description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--hold", type=float, default=15.0, help="seconds each stream stays open (the stub's pace)")
    parser.add_argument("--chunks", type=int, default=15, help="text chunks per stream, spread over --hold")
    parser.add_argument("--clients", type=int, default=4, help="load-generator processes")
    parser.add_argument("--per-address", type=int, default=50, help="connections per loopback source address")
    parser.add_argument("--gateway-env", action="append", default=[], help="NAME=VALUE for the gateway (repeatable)")
    args = parser.parse_args(argv)

    delay_ms = args.hold * 1000 / args.chunks
    stub_port = free_port()
    stub = ChildProcess.launch("stub", stub_backend.command(stub_port, args.chunks, delay_ms), stub_port)
    stub.wait_ready("/health")
    gateway = None
    # The gateway's backend connection cap (default 256) sizes what one process may hold open.
    env = {"EDGERUN_BACKEND_MAX_CONNECTIONS": str(args.streams + 64)}
    env.update(item.split("=", 1) for item in args.gateway_env)
    try:
        gateway = start_gateway(stub.port, Path(tempfile.mkdtemp(prefix="edgerun-streams-")), env)
        key = create_key(gateway.url, "bench", max_concurrent_requests=args.streams)
        url = f"{gateway.url}/client/v4/accounts/bench/ai/run/{MODEL_ID}"
        body = {"prompt": PROMPT, "max_tokens": args.chunks, "stream": True}
        pid = gateway.process.pid
        client_process(url, body, key, ["127.0.0.1"] * 4, 0.0)  # warm-up: tokenizer, pools
        idle_kib, cpu_before = rss_kib(pid), process_cpu_s(pid)
        stub_cpu_before = process_cpu_s(stub.process.pid)
        sources = source_addresses(args.streams, args.per_address)
        shares = [sources[i :: args.clients] for i in range(args.clients)]
        start_at = time.monotonic() + 2.0  # every client process is up by then
        context = multiprocessing.get_context("spawn")
        with context.Pool(args.clients) as pool:
            pending = pool.starmap_async(client_process, [(url, body, key, share, start_at) for share in shares])
            peak_kib = idle_kib
            while not pending.ready():
                peak_kib = max(peak_kib, rss_kib(pid))
                pending.wait(0.2)
            results = [r for share in pending.get() for r in share]
        cpu_s = process_cpu_s(pid) - cpu_before
        stub_cpu_s = process_cpu_s(stub.process.pid) - stub_cpu_before
        after_kib = rss_kib(pid)
    finally:
        for process in (gateway, stub):
            if process is not None:
                process.stop(timeout_s=15)

    command = "python -m benchmarks.gateway.streams " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    report = summarize(results, args, idle_kib, peak_kib, after_kib, (cpu_s, stub_cpu_s))
    print(f"`{command.strip()}`  \nmachine: {machine()}, load average {os.getloadavg()[0]:.1f}  \n{report}")
    return 0 if all(r.status == 200 and r.done for r in results) else 1


def summarize(
    results: list[StreamResult],
    args: argparse.Namespace,
    idle_kib: int,
    peak_kib: int,
    after_kib: int,
    cpu: tuple[float, float],
) -> str:
    """The report's table; `cpu`: the gateway's and the stub's CPU seconds during the streams."""
    cpu_s, stub_cpu_s = cpu
    ok = [r for r in results if r.status == 200 and r.done and r.first_chunk is not None]
    failures = Counter(
        r.error.split(":", 1)[0] if r.status == 0 else f"HTTP {r.status}" for r in results if r not in ok
    )
    open_at_once = max_open(results)
    ttfc = [(r.first_chunk or r.started) - r.started for r in ok]
    rates = [
        (r.num_events - 1) / (r.ended - r.first_chunk)
        for r in ok
        if r.first_chunk is not None and r.ended > r.first_chunk
    ]
    gaps = [r.max_gap_s for r in ok]
    duration = [r.ended - r.started for r in ok]
    failed_after = [r.ended - r.started for r in results if r not in ok]
    per_stream_kib = (peak_kib - idle_kib) / max(1, open_at_once)
    examples = sorted({r.error for r in results if r.error})[:3]
    rows = [
        ("streams opened / completed with [DONE]", f"{len(results)} / {len(ok)}"),
        ("failures", ", ".join(f"{k}: {v}" for k, v in failures.items()) or "none"),
        ("open at the same moment (max)", f"{open_at_once}"),
        (
            "gateway RSS idle / peak / after (MiB)",
            f"{idle_kib / 1024:.0f} / {peak_kib / 1024:.0f} / {after_kib / 1024:.0f}",
        ),
        ("gateway RSS per open stream (KiB)", f"{per_stream_kib:.1f}"),
        ("failed after p50 / max (s)", " / ".join(f"{pct(failed_after, q):.2f}" for q in (0.5, 1.0))),
        ("gateway CPU (s) / per stream (ms)", f"{cpu_s:.1f} / {cpu_s / max(1, len(results)) * 1000:.2f}"),
        ("stub backend CPU (s)", f"{stub_cpu_s:.1f}"),
        ("time to first chunk p50 / p99 / max (s)", " / ".join(f"{pct(ttfc, q):.2f}" for q in (0.5, 0.99, 1.0))),
        ("stream duration p50 / p99 / max (s)", " / ".join(f"{pct(duration, q):.2f}" for q in (0.5, 0.99, 1.0))),
        (
            "events/s per stream min / p1 / p50 / p99",
            " / ".join(f"{pct(rates, q):.2f}" for q in (0.0, 0.01, 0.5, 0.99)),
        ),
        ("longest gap between chunks p50 / p99 / max (s)", " / ".join(f"{pct(gaps, q):.2f}" for q in (0.5, 0.99, 1.0))),
    ]
    lines = [
        f"{args.streams} streams from {args.clients} client processes ({args.per_address} per source address), "
        f"{args.chunks} chunks over {args.hold:g}s each (the stub's pace: one every {args.hold / args.chunks:.2f}s)",
        "",
        "| measure | value |",
        "| --- | ---: |",
        *(f"| {a} | {b} |" for a, b in rows),
    ]
    if examples:
        lines += ["", "errors seen: " + "; ".join(json.dumps(e) for e in examples)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
