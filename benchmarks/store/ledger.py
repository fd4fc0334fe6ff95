"""Ledger write throughput per store, and what metering costs a request next to the gateway's overhead.

    python -m benchmarks.store.ledger [--records 2000] [--writers 32] [--requests 300] [--duration 6]

For each store (embedded SQLite, Redis at --redis-url, under a fresh key prefix deleted at the end):
- ledger appends/s: `append_usage` of distinct records, one writer, then `--writers` concurrent;
- metering per request: `Metering.reserve` + `settle` (a priced model, a tenant with a budget, so
  both touch the store), sequential, wall and CPU time per request;
- the gateway's own per-request overhead on the same store: `edgerun serve` in front of
  the stub backend (tests/gateway/stub_backend.py), one client at a time, streaming; overhead = mean latency
  through the gateway minus mean latency straight to the stub, and the gateway's CPU per request.
The last columns give metering as a share of that overhead (wall, CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import interleave, machine
from benchmarks.gateway.raw_load import drive
from cli.processes import ChildProcess
from contracts.usage import Usage
from gateway.billing.metering import MeteredRequest, Metering
from gateway.context import Principal
from gateway.fleet.catalog import ModelSpec
from gateway.metrics import GatewayMetrics
from gateway.pipeline.concurrency import TenantSlots
from gateway.pipeline.ticket import Admitter
from gateway.settings import GatewaySettings
from gateway.store import Store, open_store
from gateway.store.models import UsageRecord
from policies.pricing import PriceTable
from tests.gateway.fixtures_context import context_now
from tests.gateway.stub_backend import MODEL_ID, PROMPT, create_key, start_gateway, start_stub

PRICE = {"version": "bench", "input": "0.027", "cached_input": "0.0045", "output": "0.201"}


@dataclass
class Result:
    store: str
    appends_1: float = 0.0
    appends_n: float = 0.0
    metering_wall_ms: float = 0.0
    metering_cpu_ms: float = 0.0
    gateway_added_ms: float = 0.0
    gateway_cpu_ms: float = 0.0


def usage_record(i: int, run: str) -> UsageRecord:
    now = time.time()
    return UsageRecord(
        request_id=f"{run}-{i}", tenant_id="bench", account_id="bench", key_id="k", model=MODEL_ID, region="local",
        backend_id="stub", session_id=None, started_at=now - 0.5, ended_at=now, status="ok", prompt_tokens=40,
        cached_tokens=16, completion_tokens=8, price_version="bench", cost_micro=3, metadata={"bench": True},
    )


async def appends_per_s(store: Store, n: int, writers: int) -> float:
    run = uuid.uuid4().hex[:8]
    records = [usage_record(i, run) for i in range(n)]
    queue = iter(records)

    async def writer() -> None:
        for record in queue:
            assert await store.ledger.append(record)

    start = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(writers)))
    return n / (time.perf_counter() - start)


async def metering_per_request(store: Store, n: int) -> tuple[float, float]:
    tenant = await store.tenancy.create_tenant("bench", ["bench-" + uuid.uuid4().hex[:8]], monthly_budget_micro=10**15)
    key, _ = await store.tenancy.create_key(tenant.id)
    principal = Principal(key, tenant, tenant.account_ids[0])
    metering = Metering(store, PriceTable.from_config({MODEL_ID: PRICE}), GatewayMetrics())
    admitter = Admitter(store.admission, metering, TenantSlots(None))
    model = ModelSpec(id=MODEL_ID, backend_model=MODEL_ID)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        request = MeteredRequest(context_now(uuid.uuid4().hex, principal, model), 40)
        ticket = await admitter.admit(request, 48, 8)
        await metering.settle(request, Usage(40, 8, 16), status="ok", backend_id="stub", region="local",
                              release=ticket.release(48, None))
    return (time.perf_counter() - wall) / n * 1000, (time.process_time() - cpu) / n * 1000


def gateway_overhead(env: dict[str, str], stub: ChildProcess, workdir: Path, duration_s: float) -> tuple[float, float]:
    """(added latency ms, gateway CPU ms) per request, one streaming client at a time."""
    gateway = start_gateway(stub.port, workdir, env)
    try:
        account = "bench-" + uuid.uuid4().hex[:8]
        auth = {"authorization": f"Bearer {create_key(gateway.url, account, monthly_budget_micro=10**15)}"}
        direct_url = f"{stub.url}/v1/completions"
        direct_body = {"model": "stub", "prompt": list(range(40)), "max_tokens": 8, "stream": True}
        url = f"{gateway.url}/client/v4/accounts/{account}/ai/run/{MODEL_ID}"
        body = {"prompt": PROMPT, "max_tokens": 8, "stream": True}
        pid = gateway.process.pid

        async def run() -> tuple[float, float]:
            await drive("warm-up", url, body, auth, 1, 1.0)
            paired = await interleave(
                lambda: drive("direct", direct_url, direct_body, {}, 1, duration_s / 3),
                lambda: drive("gateway", url, body, auth, 1, duration_s / 3, pid),
                3,
            )
            direct = [s for phase in paired.baseline for s in phase.latencies_s]
            through = [s for phase in paired.subject for s in phase.latencies_s]
            added = (sum(through) / len(through) - sum(direct) / len(direct)) * 1000
            return added, sum(phase.cpu_s for phase in paired.subject) / len(through) * 1000

        return asyncio.run(run())
    finally:
        gateway.stop(timeout_s=15)


async def measure_store(name: str, settings: GatewaySettings, args: argparse.Namespace) -> Result:
    store = open_store(settings.store)
    try:
        result = Result(name)
        await appends_per_s(store, min(200, args.records), 1)  # warm-up
        result.appends_1 = await appends_per_s(store, args.records, 1)
        result.appends_n = await appends_per_s(store, args.records, args.writers)
        result.metering_wall_ms, result.metering_cpu_ms = await metering_per_request(store, args.requests)
        return result
    finally:
        await store.aclose()


def run_store(
    name: str, settings: GatewaySettings, args: argparse.Namespace, env: dict[str, str], stub: ChildProcess, workdir: Path
) -> Result:
    """Every measurement on one store; a Redis store's keys are deleted afterwards."""
    if settings.store.redis_url:
        env = {**env, "EDGERUN_REDIS_URL": settings.store.redis_url, "EDGERUN_KEY_PREFIX": settings.store.key_prefix}
    try:
        result = asyncio.run(measure_store(name, settings, args))
        result.gateway_added_ms, result.gateway_cpu_ms = gateway_overhead(env, stub, workdir, args.duration)
        return result
    finally:
        if settings.store.redis_url:
            asyncio.run(drop_prefix(settings.store.redis_url, settings.store.key_prefix))


async def drop_prefix(url: str, prefix: str) -> None:
    import redis.asyncio as aioredis

    client = aioredis.from_url(url)
    try:
        keys = [k async for k in client.scan_iter(match=prefix + "*", count=1000)]
        for i in range(0, len(keys), 500):
            await client.delete(*keys[i : i + 500])
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.store.ledger", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2000, help="ledger appends per measurement")
    parser.add_argument("--writers", type=int, default=32, help="concurrent writers for the second measurement")
    parser.add_argument("--requests", type=int, default=300, help="metered requests (reserve + settle)")
    parser.add_argument("--duration", type=float, default=6.0, help="seconds of gateway traffic per store")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="edgerun-bench-ledger-"))
    prefix = f"edgerun-bench:{uuid.uuid4().hex[:8]}:"
    stores = {
        "embedded (SQLite)": GatewaySettings(redis_url=None, sqlite_path=str(workdir / "ledger.sqlite3")),
        "Redis": GatewaySettings(redis_url=args.redis_url, key_prefix=prefix),
    }
    stub = start_stub(8)
    results = []
    try:
        base_env = {"EDGERUN_PRICES": json.dumps({MODEL_ID: PRICE})}
        for i, (name, settings) in enumerate(stores.items()):
            env = {**base_env, "EDGERUN_SQLITE_PATH": str(workdir / f"gateway-{i}.sqlite3")}
            results.append(run_store(name, settings, args, env, stub, workdir))
    finally:
        stub.stop(timeout_s=15)
        shutil.rmtree(workdir, ignore_errors=True)
    command = "python -m benchmarks.store.ledger " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    print(report(results, args, command.strip()))
    return 0


def report(results: list[Result], args: argparse.Namespace, command: str) -> str:
    lines = [
        f"`{command}`  ",
        f"machine: {machine()}  ",
        f"{args.records} ledger appends per measurement; {args.requests} metered requests (reserve + settle); "
        f"gateway overhead: one streaming client, 8 chunks, {args.duration:g}s each way",
        "",
        "| store | appends/s, 1 writer | appends/s, "
        f"{args.writers} writers | metering per request, wall / CPU (ms) | gateway overhead per request, "
        "added latency / CPU (ms) | metering share, wall / CPU |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        share_wall = r.metering_wall_ms / r.gateway_added_ms if r.gateway_added_ms > 0 else float("nan")
        share_cpu = r.metering_cpu_ms / r.gateway_cpu_ms if r.gateway_cpu_ms > 0 else float("nan")
        lines.append(
            f"| {r.store} | {r.appends_1:,.0f} | {r.appends_n:,.0f} "
            f"| {r.metering_wall_ms:.2f} / {r.metering_cpu_ms:.2f} "
            f"| {r.gateway_added_ms:.2f} / {r.gateway_cpu_ms:.2f} | {share_wall:.0%} / {share_cpu:.0%} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
