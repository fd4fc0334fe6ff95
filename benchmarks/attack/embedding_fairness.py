"""One tenant's big embedding batches against another tenant's small requests, on a real
`edgerun backend --engine embedding` (all-MiniLM-L6-v2): the attack of issue 36, measured.

Tenant `big` keeps `--batches` requests of 100 texts at the model's 256-token limit in flight
(each retried after its Retry-After when the backend's queue refuses it, so the pressure never
lets up); tenant `small` sends a two-word request every `--interval-s`. Both name their tenant
in `user`, as the gateway does. Reports the small requests' latency (median, p90, max), the big
batches answered and refused, the backend's RSS before and at its largest, and its /metrics
counters. Prints one JSON object.

    python -m benchmarks.attack.embedding_fairness --seconds 30 --batches 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

import httpx

from benchmarks.backend.embeddings import KEY, embedding_backend
from benchmarks.common import machine, rss_mb
from cli.processes import ChildProcess

FULL_TEXT = "Café au lait, the quick brown fox jumps over the lazy dog. " * 40  # truncated to 256 tokens
RETRY_AFTER_DEFAULT_S = 1.0


async def big_tenant(client: httpx.AsyncClient, until: float, counts: dict[str, int]) -> None:
    body = {"input": [FULL_TEXT] * 100, "user": "big"}
    while time.monotonic() < until:
        answer = await client.post("/v1/embeddings", json=body)
        if answer.status_code == 429:
            counts["refused"] += 1
            await asyncio.sleep(float(answer.headers.get("retry-after", RETRY_AFTER_DEFAULT_S)))
            continue
        answer.raise_for_status()
        counts["answered"] += 1


async def small_tenant(client: httpx.AsyncClient, until: float, interval_s: float, latencies: list[float]) -> None:
    while time.monotonic() < until:
        started = time.perf_counter()
        answer = await client.post("/v1/embeddings", json={"input": "two words", "user": "small"})
        answer.raise_for_status()
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(max(0.0, interval_s - latencies[-1]))


async def watch_rss(pid: int, until: float, peak: list[float]) -> None:
    while time.monotonic() < until:
        peak[0] = max(peak[0], rss_mb(pid))
        await asyncio.sleep(0.1)


async def measure(backend: ChildProcess, seconds: float, batches: int, interval_s: float) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {KEY}"}
    limits = httpx.Limits(max_connections=batches + 4)
    async with httpx.AsyncClient(base_url=backend.url, headers=headers, timeout=600, limits=limits) as client:
        await client.post("/v1/embeddings", json={"input": [FULL_TEXT] * 8})  # warm-up
        rss_before = rss_mb(backend.process.pid)
        peak = [rss_before]
        counts = {"answered": 0, "refused": 0}
        latencies: list[float] = []
        until = time.monotonic() + seconds
        await asyncio.gather(
            *(big_tenant(client, until, counts) for _ in range(batches)),
            small_tenant(client, until, interval_s, latencies),
            watch_rss(backend.process.pid, until, peak),
        )
        metrics = (await client.get("/metrics")).text
    latencies.sort()
    return {
        "small_requests": len(latencies),
        "small_latency_s": {
            "median": round(statistics.median(latencies), 3),
            "p90": round(latencies[int(0.9 * (len(latencies) - 1))], 3),
            "max": round(latencies[-1], 3),
        },
        "big_batches": counts,
        "backend_rss_mb": {"before": round(rss_before), "peak": round(peak[0])},
        "backend_metrics": [line for line in metrics.splitlines() if line.startswith("edgerun_backend_embedding")],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--batches", type=int, default=8, help="big batches the big tenant keeps in flight")
    parser.add_argument("--interval-s", type=float, default=0.5, help="between the small tenant's requests")
    args = parser.parse_args()
    with embedding_backend() as backend:
        load_before = os.getloadavg()
        report = asyncio.run(measure(backend, args.seconds, args.batches, args.interval_s))
    extra = {"machine": machine(), "load_average": [load_before, os.getloadavg()]}
    print(json.dumps({**vars(args), **report, **extra}, indent=1))


if __name__ == "__main__":
    main()
