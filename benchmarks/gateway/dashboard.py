"""What the usage dashboard's API costs: answer time against ledger size, compared with just
reading the same records from the ledger, and how long it holds the gateway's event loop (which
also serves the inference streams).

    python -m benchmarks.gateway.dashboard [--records 1000 10000 50000] [--repeats 3] [--span-days 0.0417]

For each size, a gateway (local store in a temporary SQLite file, no backends) is started in
this process under uvicorn and the ledger is filled with that many records inside the last
`--span-days` (default: the last hour; 93 is the longest range the API takes, whose whole hours the
ledger's hourly sums answer), appended in the order they ended, as a gateway appends them. Then, alternating, `repeats` times each:
- the baseline: `store.ledger.iter_usage` over that span, records only (what any reader pays);
- the API: `GET /dashboard/api/usage` (admin, that span) from a thread, while a ticker on the
  gateway's loop sleeps 1 ms at a time and records the longest gap: the worst delay a stream's
  next chunk would have seen ("idle stall" is the same ticker with nothing else running).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import structlog
import uvicorn

from benchmarks.common import machine
from cli.processes import free_port
from gateway.billing.prices import DEFAULT_PRICE_VERSION
from gateway.billing.savings import record_savings
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.http.app import create_app
from gateway.settings import GatewaySettings
from gateway.store import open_store
from gateway.store.models import UsageRecord

TOKEN = "bench-admin-token-0123456789abcdefghij"  # admin_token: at least 32 characters


def records(n: int, now: float, span_s: float) -> list[UsageRecord]:
    rng = random.Random(0)
    made = []
    for i in range(n):
        ended = now - rng.random() * (span_s - 100)
        made.append(UsageRecord(
            request_id=f"bench-{i}", tenant_id=rng.choice(("acme", "beta", "gamma")), account_id="acc",
            key_id="key_1", model=DEFAULT_MODEL_ID, region=rng.choice(("eu", "us")),
            backend_id=rng.choice(("b1", "b2", "b3", "b4")), session_id=None, started_at=ended - 1, ended_at=ended,
            status="ok", prompt_tokens=2000, cached_tokens=rng.randint(0, 2000), completion_tokens=200,
            price_version=DEFAULT_PRICE_VERSION, cost_micro=100, ttft_s=rng.random(), itl_s=rng.random() / 20,
        ))
    return made


async def ticker(stop: asyncio.Event, gaps: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def measure(n: int, repeats: int, span_s: float) -> tuple[list[float], list[float], float, float]:
    """(API answer times, baseline read times, longest loop gap while answering, longest gap idle)."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = GatewaySettings(
            redis_url=None, sqlite_path=str(Path(tmp) / "g.sqlite3"), admin_token=TOKEN, tokenizer_cache_dir=None,
            log_level="warning",
        )
        store = open_store(settings.store, record_savings(settings.billing))
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(settings, store=store), port=port, log_config=None,
                                               access_log=False))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        now = time.time()
        made = sorted(records(n, now, span_s), key=lambda r: r.ended_at)  # appended as requests end
        for i in range(0, n, 1000):
            await asyncio.gather(*(store.ledger.append(r) for r in made[i : i + 1000]))
        url = f"http://127.0.0.1:{port}/dashboard/api/usage?from={now - span_s + 60}&to={now + 60}"
        headers = {"authorization": f"Bearer {TOKEN}"}

        idle_gaps: list[float] = []
        stop = asyncio.Event()
        tick = asyncio.create_task(ticker(stop, idle_gaps))
        await asyncio.sleep(1.0)
        stop.set()
        await tick

        api_times: list[float] = []
        read_times: list[float] = []
        gaps: list[float] = []
        for _ in range(repeats):
            started = time.perf_counter()
            count = sum([1 async for _ in store.ledger.iter_usage(now - span_s + 60, now + 60)])
            read_times.append(time.perf_counter() - started)
            assert count == n
            stop = asyncio.Event()
            tick = asyncio.create_task(ticker(stop, gaps))
            started = time.perf_counter()
            answer = await asyncio.to_thread(httpx.get, url, headers=headers, timeout=300)
            api_times.append(time.perf_counter() - started)
            stop.set()
            await tick
            assert answer.status_code == 200 and answer.json()["totals"]["requests"] == n, answer.text[:200]
        server.should_exit = True
        await serving
        await store.aclose()
    return api_times, read_times, max(gaps), max(idle_gaps)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, nargs="+", default=[1000, 10_000, 50_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--span-days", type=float, default=1 / 24, help="the records' and the query's range")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))  # no access log
    print(f"machine: {machine()}; load average {os.getloadavg()[0]:.1f} at start")
    print("| records | API answer p50 | ledger read p50 (baseline) | API / read | API per record | longest loop stall | idle stall |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in args.records:
        api_times, read_times, stall, idle = await measure(n, args.repeats, args.span_days * 86_400)
        api_p50, read_p50 = statistics.median(api_times), statistics.median(read_times)
        print(f"| {n} | {api_p50 * 1000:.0f} ms | {read_p50 * 1000:.0f} ms | {api_p50 / read_p50:.2f} "
              f"| {api_p50 / n * 1e6:.0f} us | {stall * 1000:.0f} ms | {idle * 1000:.1f} ms |", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end")

if __name__ == "__main__":
    asyncio.run(main())
