"""The store calls of one streamed request, made as fast as K worker processes can, on each store.

    python -m benchmarks.store.request_calls [--workers 1,2] [--seconds 5] [--rounds 3] [--concurrency 32]
        [--stores local,shared,redis] [--gateway-work-us 0]

- local: the one-process local store in the worker (one worker only: nothing else can share it);
- shared: the local store's shared mode, K workers on one SQLite file (every check-and-change under its
  write lock);
- redis: a private `redis-server` this script starts on a Unix socket in a temporary directory (what
  `serve --workers N` would start without a configured Redis), K workers on it; its CPU is reported.

Each worker (on uvloop where installed, as a gateway worker) runs `--concurrency` requests at a
time, each the calls a streamed request makes, in the gateway's order (authenticate, count the
request, route lookup, admit, started, first token, settle with the ledger record: seven).
Configurations alternate within each round; medians over rounds are reported: requests/s, each
worker's CPU per request, redis-server's CPU per request (its serial cost: 1000 / it is the
requests/s no number of workers can pass) and the shared store's write-lock hold per request (its
serial cost, the same way). `--gateway-work-us` adds a gateway's own Python work to each request, so
the worker's event loop competes for its GIL with the shared store's thread as in a gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import tempfile
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from benchmarks.common import machine, process_cpu_s
from benchmarks.gateway.workers import start_private_redis
from gateway.store import Claim, Inflight, Release, RouteKey, Store, UsageRecord, open_store
from gateway.store.settings import StoreSettings

MONTH = "2026-11"
RESERVE_MICRO = 1_000
BLOCKS = 8  # prompt blocks per request (prefix hashes matched and recorded)
PREFIXES = 64  # distinct prompt prefixes
BACKENDS = 4


def _spin(us: float) -> None:
    """Hold this process's GIL for `us` microseconds of Python work (the gateway's own part of a request)."""
    if us > 0:
        until = time.perf_counter() + us / 1e6
        while time.perf_counter() < until:
            pass


async def one_request(store: Store, secret: str, request_id: str, n: int, work_us: float = 0.0) -> None:
    """The store calls of one streamed request (gateway/pipeline/auth.py, routing.py, ticket.py;
    gateway/billing/metering.py), in their order. `work_us`: the gateway's own work, in four parts
    between the calls (parsing, routing, streaming, metering), with an `await asyncio.sleep(0)` after
    each so other requests interleave as in a gateway."""
    _spin(work_us / 4)
    found = await store.tenancy.authenticate(secret)
    assert found is not None
    key, tenant = found
    estimate, actual, prompt, max_tokens = 300, 220, 200, 100
    assert (await store.admission.check_and_consume(key.id, key.rpm, None, 0)).allowed
    _spin(work_us / 4)
    await asyncio.sleep(0)
    hashes = [(n % PREFIXES) * 1000 + j for j in range(BLOCKS)]
    await store.routing.lookup(RouteKey(hashes, tenant.id, f"s{n % PREFIXES}"))
    backend = f"b{n % BACKENDS}"
    claim = Claim(tenant.id, request_id, slot_limit=1_000_000, key_id=key.id, tpm=key.tpm, tokens=estimate,
                  month=MONTH, amount_micro=RESERVE_MICRO, budget_micro=tenant.monthly_budget_micro,
                  inflight=Inflight(backend, prompt, max_tokens))
    assert (await store.admission.admit(claim)).allowed
    await store.routing.started(backend, RouteKey(hashes, tenant.id, f"s{n % PREFIXES}"))  # first chunk
    await store.routing.release_inflight(Inflight(backend, prompt, 0))  # first token
    _spin(work_us / 4)
    await asyncio.sleep(0)
    _spin(work_us / 4)
    await asyncio.sleep(0)
    now = time.time()
    record = UsageRecord(
        request_id=request_id, tenant_id=tenant.id, account_id="acct", key_id=key.id, model="m", region=None,
        backend_id=backend, session_id=None, started_at=now - 0.5, ended_at=now, status="ok", prompt_tokens=prompt,
        cached_tokens=0, completion_tokens=actual - prompt, price_version="v1", cost_micro=700,
    )  # fmt: skip
    release = Release(tenant.id, request_id, slot=True, key_id=key.id, tokens_counted=estimate, tokens_used=actual,
                      month=MONTH, reserved_micro=RESERVE_MICRO, cost_micro=700, inflight=Inflight(backend, 0, max_tokens))
    assert await store.admission.settle(release, record)


def _time_lock_holds() -> list[float]:
    """Sum, in this process, how long the shared store's group transactions hold the file's write lock."""
    from gateway.store.local.shared_tables import SharedTables

    held = [0.0]
    begin, commit = SharedTables._begin, SharedTables.commit
    began: dict[int, float] = {}

    def timed_begin(self: SharedTables) -> None:
        begin(self)
        began[id(self)] = time.perf_counter()

    def timed_commit(self: SharedTables) -> None:
        open_ = self._conn.in_transaction
        commit(self)
        if open_:
            held[0] += time.perf_counter() - began.pop(id(self))

    SharedTables._begin = timed_begin  # type: ignore[method-assign]
    SharedTables.commit = timed_commit  # type: ignore[method-assign]
    return held


async def _drive(kind: str, settings: StoreSettings, secret: str, tag: str, seconds: float, concurrency: int,
                 work_us: float, barrier: Barrier) -> tuple[int, float, float, float]:  # fmt: skip
    held = _time_lock_holds() if kind == "shared" else [0.0]
    store = open_store(settings)
    counter = iter(range(10**9))
    for _ in range(20):  # warm up: connection, caches, lease task
        n = next(counter)
        await one_request(store, secret, f"{tag}-{n}", n)
    barrier.wait(120)
    held[0] = 0.0
    cpu0, t0 = time.process_time(), time.monotonic()
    stop_at, done = t0 + seconds, [0]

    async def requests() -> None:
        while time.monotonic() < stop_at:
            n = next(counter)
            await one_request(store, secret, f"{tag}-{n}", n, work_us)
            done[0] += 1

    await asyncio.gather(*(requests() for _ in range(concurrency)))
    cpu, wall, lock = time.process_time() - cpu0, time.monotonic() - t0, held[0]
    barrier.wait(120)
    await store.aclose()
    return done[0], cpu, wall, lock


def _worker(kind: str, settings: StoreSettings, secret: str, tag: str, seconds: float, concurrency: int,
            work_us: float, barrier: Barrier, results: multiprocessing.Queue[tuple[int, float, float, float]]) -> None:  # fmt: skip
    run: Any = asyncio.run
    try:  # the loop uvicorn gives a gateway worker, where installed
        import uvloop

        run = uvloop.run
    except ImportError:
        pass
    results.put(run(_drive(kind, settings, secret, tag, seconds, concurrency, work_us, barrier)))


async def _seed(settings: StoreSettings) -> str:
    """A tenant and a key with limits that never refuse (so every check runs); the key's secret."""
    store = open_store(settings)
    try:
        tenant = await store.tenancy.create_tenant("Bench", ["acct"], tenant_id="bench", monthly_budget_micro=10**15)
        _, secret = await store.tenancy.create_key(tenant.id, rpm=10**9, tpm=10**12)
        return secret
    finally:
        await store.aclose()


def run_one(
    kind: str, workers: int, seconds: float, concurrency: int, tag: str, work_us: float = 0.0
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="edgerun-store-bench-") as tmp:
        server, url = start_private_redis(Path(tmp)) if kind == "redis" else (None, None)
        settings = StoreSettings(sqlite_path=str(Path(tmp) / "gateway.sqlite3"), sqlite_shared=kind == "shared",
                                 redis_url=url, key_prefix=f"bench-{tag}:")
        try:
            secret = asyncio.run(_seed(settings))
            context = multiprocessing.get_context("spawn")
            results: multiprocessing.Queue[tuple[int, float, float, float]] = context.Queue()
            barrier = context.Barrier(workers + 1)
            children = [
                context.Process(
                    target=_worker,
                    args=(kind, settings, secret, f"{tag}-w{i}", seconds, concurrency, work_us, barrier, results),
                )
                for i in range(workers)
            ]
            for child in children:
                child.start()
            barrier.wait(300)
            server0 = process_cpu_s(server.pid) if server else 0.0
            barrier.wait(300)
            server1 = process_cpu_s(server.pid) if server else 0.0
            outcomes = [results.get(timeout=120) for _ in children]
            for child in children:
                child.join(timeout=60)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
    requests = sum(o[0] for o in outcomes)
    wall = statistics.mean(o[2] for o in outcomes)
    return {
        "req_s": requests / wall,
        "worker_cpu_ms": 1000 * sum(o[1] for o in outcomes) / requests,
        "redis_cpu_ms": 1000 * (server1 - server0) / requests,
        "lock_ms": 1000 * sum(o[3] for o in outcomes) / requests,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2", help="worker process counts, comma separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per configuration")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight per worker")
    parser.add_argument("--stores", default="local,shared,redis")
    parser.add_argument(
        "--gateway-work-us", type=float, default=0.0,
        help="Python work per request besides the store calls (a gateway's own, ~700 us on 16 idle cores)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    configs = [(kind, k) for k in counts for kind in args.stores.split(",") if kind != "local" or k == 1]
    print(f"machine: {machine()}")
    print(f"load average before: {os.getloadavg()}")
    runs: dict[tuple[str, int], list[dict[str, float]]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for kind, workers in configs:
            result = run_one(kind, workers, args.seconds, args.concurrency, f"r{r}", args.gateway_work_us)
            runs[(kind, workers)].append(result)
            print(f"  round {r} {kind} x{workers}: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()), flush=True)
    print(f"load average after: {os.getloadavg()}")
    base = statistics.median(x["req_s"] for x in runs.get(("local", 1), [])) if ("local", 1) in runs else None
    print(
        "\n| store | workers | req/s | vs local | worker CPU ms/req | redis-server CPU ms/req "
        "| lock hold ms/req | serial cap req/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (kind, workers), results in runs.items():
        med: dict[str, Any] = {k: statistics.median(x[k] for x in results) for k in results[0]}
        serial = med["redis_cpu_ms"] if kind == "redis" else med["lock_ms"] if kind == "shared" else 0.0
        cap = f"{1000 / serial:,.0f}" if serial else "-"
        ratio = f"{med['req_s'] / base:.2f}x" if base else "-"
        print(
            f"| {kind} | {workers} | {med['req_s']:,.0f} | {ratio} | {med['worker_cpu_ms']:.3f} | "
            f"{med['redis_cpu_ms']:.3f} | {med['lock_ms']:.3f} | {cap} |"
        )


if __name__ == "__main__":
    main()
