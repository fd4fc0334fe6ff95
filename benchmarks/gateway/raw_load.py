"""Load generation with a lean raw HTTP/1.1 client, so the load generator steals little CPU from
what it measures: keep-alive connections, closed-loop or Poisson arrivals, latencies per phase."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.common import process_cpu_s


class RawConnection:
    """One keep-alive HTTP/1.1 connection; reads chunked or sized bodies to the end.

    quickack: acknowledge what has arrived at once (TCP_QUICKACK after each read of the head and
    of each chunk) instead of when the kernel's delayed-ACK timer fires, up to 40 ms later on Linux.
    A server that streams with Nagle's algorithm on (no TCP_NODELAY) holds each small write until
    the previous one is acknowledged, so on a keep-alive connection its stream otherwise stalls.
    """

    def __init__(self, host: str, port: int, quickack: bool = False) -> None:
        self.host, self.port = host, port
        self.quickack = quickack
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def may_ack(self) -> None:
        if self.quickack and self.writer is not None:
            self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)

    async def post(self, request: bytes) -> tuple[int, bytes]:
        """Send one request -> (status, body); a chunked body comes back as its chunks joined."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        self.may_ack()
        status = int(head.split(b" ", 2)[1])
        lowered = head.lower()
        if b"transfer-encoding: chunked" in lowered:
            chunks = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                chunks.append((await self.reader.readexactly(size + 2))[:-2])
                self.may_ack()
                if size == 0:
                    break
            return status, b"".join(chunks)
        length = int(lowered.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def raw_request(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[str, int, bytes]:
    parsed = httpx.URL(url)
    payload = json.dumps(body).encode()
    lines = [
        f"POST {parsed.raw_path.decode()} HTTP/1.1",
        f"host: {parsed.host}:{parsed.port}",
        "content-type: application/json",
        f"content-length: {len(payload)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return parsed.host, int(parsed.port or 80), ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


def distinct_bodies(body: dict[str, Any], count: int = 1024) -> list[dict[str, Any]]:
    """`count` copies of a body whose text prompt (or last chat message) differs in each (a numbered
    suffix), so the gateway does its per-prompt work (template, tokenizer, prefix lookup) on every
    request, as it does on real traffic, rather than meeting one prompt over and over that a cache
    would hide. Token-id prompts are kept as is."""
    if isinstance(body.get("prompt"), str):
        return [{**body, "prompt": f"{body['prompt']} (request {i})"} for i in range(count)]
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1].get("content"), str):
        *earlier, last = messages
        return [
            {**body, "messages": [*earlier, {**last, "content": f"{last['content']} (request {i})"}]}
            for i in range(count)
        ]
    return [body]


@dataclass
class Phase:
    name: str
    latencies_s: list[float]
    errors: int
    elapsed_s: float
    cpu_s: float = 0.0  # CPU time the gateway process used during the phase
    # what each failed request got: its HTTP status, or the exception that ended its connection
    failures: Counter[str] = field(default_factory=Counter)
    samples: dict[str, str] = field(default_factory=dict)  # the first body seen for each failure

    @property
    def failures_text(self) -> str:
        """The failures by kind, most frequent first ("429 x3, IncompleteReadError x1"), or "none"."""
        return ", ".join(f"{kind} x{count}" for kind, count in self.failures.most_common()) or "none"

    @property
    def rps(self) -> float:
        return len(self.latencies_s) / self.elapsed_s

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    def __add__(self, other: Phase) -> Phase:
        return Phase(
            self.name,
            self.latencies_s + other.latencies_s,
            self.errors + other.errors,
            self.elapsed_s + other.elapsed_s,
            self.cpu_s + other.cpu_s,
            self.failures + other.failures,
            {**other.samples, **self.samples},
        )


async def drive(
    name: str,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    concurrency: int,
    duration_s: float,
    watch_pid: int | None = None,
    rate: float | None = None,
    quickack: bool = False,
) -> Phase:
    """`concurrency` clients, each on its own keep-alive connection, for `duration_s`, sending the
    `distinct_bodies` of `body` in turn: closed loop (each sends its next request as soon as the
    last one ends), or with `rate`, requests arriving at `rate` per second in all (Poisson), each
    client taking the next arrival when it is free. Latency counts from the arrival, not the send,
    so a client that falls behind shows it. Failures are counted by kind (`Phase.failures`).
    quickack: as for `RawConnection`."""
    requests = [raw_request(url, variant, headers)[2] for variant in distinct_bodies(body)]
    host, port, _ = raw_request(url, body, headers)
    sent = 0
    latencies: list[float] = []
    errors = 0
    failures: Counter[str] = Counter()
    samples: dict[str, str] = {}
    deadline = time.perf_counter() + duration_s
    arrivals = random.Random(0)
    next_arrival = time.perf_counter()

    async def client() -> None:
        nonlocal errors, next_arrival, sent
        connection = RawConnection(host, port, quickack)
        try:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                if rate is not None:
                    start = next_arrival = max(next_arrival, start - 1.0) + arrivals.expovariate(rate)
                    await asyncio.sleep(max(0.0, start - time.perf_counter()))
                request = requests[sent % len(requests)]
                sent += 1
                try:
                    status, answer = await connection.post(request)
                    failure = "" if status == 200 else str(status)
                except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                    failure, answer = type(exc).__name__, str(exc).encode()
                    connection.close()
                    connection = RawConnection(host, port, quickack)
                if not failure:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors += 1
                    failures[failure] += 1
                    samples.setdefault(failure, answer[:300].decode(errors="replace"))
        finally:
            connection.close()

    cpu_before = process_cpu_s(watch_pid) if watch_pid else 0.0
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    cpu = process_cpu_s(watch_pid) - cpu_before if watch_pid else 0.0
    return Phase(name, latencies, errors, elapsed, cpu, failures, samples)
