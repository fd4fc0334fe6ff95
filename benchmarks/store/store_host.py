"""The store calls of one streamed request, made as fast as K worker processes can, on three stores.

    python -m benchmarks.store.store_host [--workers 1,2] [--seconds 5] [--rounds 3] [--concurrency 32] [--gateway-work-us 0]

- embedded: the one-process `EmbeddedStore` in the worker (one worker only: nothing else can share it);
- shared: `SharedEmbeddedStore`, K workers on one SQLite file (every check-and-change under its write lock);
- hosted: a store host (`python -m gateway.store.host`) and K workers with `HostedStore`.

Each worker (on uvloop where installed, as a gateway worker) runs `--concurrency` requests at a
time, each the calls a streamed request makes, in the gateway's order (auth, limits, slot, budget,
routing, prefix record, in-flight releases, reconcile, ledger, settle, slot release).
Configurations alternate within each round; medians over rounds are reported: requests/s, each
worker's CPU per request, the host's CPU per request (its serial cost: 1000 / it is the requests/s
no number of workers can pass; in brackets its event loop's part, the rest is its SQLite thread)
and the shared store's write-lock hold per request (its serial cost, the same way).
`--gateway-work-us` adds a gateway's own Python work to each request, so the worker's event loop
competes for its GIL with the shared store's thread as in a gateway.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import statistics
import subprocess
import tempfile
import time
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from benchmarks.common import machine, process_cpu_s
from gateway.store import Store, UsageRecord
from gateway.store.host.process import start_host
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
    """The store calls of one streamed request (gateway/pipeline/auth.py, concurrency.py, routing.py;
    gateway/billing/metering.py), in their order; routing's two lookups run together off memory.
    `work_us`: the gateway's own work, in four parts between the calls (parsing, routing, streaming,
    metering), with an `await asyncio.sleep(0)` after each so other requests interleave as in a gateway."""
    _spin(work_us / 4)
    key = await store.lookup_key(secret)
    assert key is not None
    tenant = await store.get_tenant(key.tenant_id)
    assert tenant is not None
    estimate, actual, prompt, max_tokens = 300, 220, 200, 100
    assert (await store.check_and_consume(key.id, key.rpm, key.tpm, estimate)).allowed
    assert await store.acquire_request_slot(tenant.id, request_id, 1_000_000)
    assert (await store.reserve_budget(tenant.id, MONTH, RESERVE_MICRO, tenant.monthly_budget_micro)).allowed
    _spin(work_us / 4)
    await asyncio.sleep(0)
    hashes = [(n % PREFIXES) * 1000 + j for j in range(BLOCKS)]
    if store.answers_in_memory:
        await store.loads(), await store.match_prefix(hashes)
    else:
        await asyncio.gather(store.loads(), store.match_prefix(hashes))
    backend = f"b{n % BACKENDS}"
    await store.add_inflight(backend, prompt, max_tokens)
    await store.record_prefix(backend, hashes)  # first chunk
    await store.release_inflight(backend, prompt, 0)  # first token
    _spin(work_us / 4)
    await asyncio.sleep(0)
    await store.release_inflight(backend, 0, max_tokens)  # finished
    await store.reconcile_tokens(key.id, estimate, actual)
    _spin(work_us / 4)
    await asyncio.sleep(0)
    now = time.time()
    record = UsageRecord(
        request_id=request_id, tenant_id=tenant.id, account_id="acct", key_id=key.id, model="m", region=None,
        backend_id=backend, session_id=None, started_at=now - 0.5, ended_at=now, status="ok", prompt_tokens=prompt,
        cached_tokens=0, completion_tokens=actual - prompt, price_version="v1", cost_micro=700,
    )  # fmt: skip
    assert await store.append_usage(record)
    await store.settle_budget(tenant.id, MONTH, RESERVE_MICRO, 700)
    await store.release_request_slot(tenant.id, request_id)


def _open(kind: str, settings: StoreSettings) -> Store:
    if kind == "shared":
        from gateway.store.embedded_shared import SharedEmbeddedStore

        return SharedEmbeddedStore(settings)
    if kind == "hosted":
        from gateway.store.host.client import HostedStore

        return HostedStore(settings)
    from gateway.store.embedded import EmbeddedStore

    return EmbeddedStore(settings)


def _time_lock_holds() -> list[float]:
    """Sum, in this process, how long the shared store's group transactions hold the file's write lock."""
    from gateway.store.sqlite_shared import SharedTables

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
    store = _open(kind, settings)
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


def _start_host(settings: StoreSettings) -> subprocess.Popen[bytes]:
    assert settings.store_socket is not None
    env = {**os.environ, "EDGERUN_SQLITE_PATH": settings.sqlite_path, "EDGERUN_LOG_LEVEL": "warning"}
    return start_host(settings.store_socket, env)


async def _seed(settings: StoreSettings) -> str:
    """A tenant and a key with limits that never refuse (so every check runs); the key's secret."""
    from gateway.store.embedded import EmbeddedStore

    store = EmbeddedStore(settings)
    try:
        tenant = await store.create_tenant("Bench", ["acct"], tenant_id="bench", monthly_budget_micro=10**15)
        _, secret = await store.create_key(tenant.id, rpm=10**9, tpm=10**12)
        return secret
    finally:
        await store.aclose()


def _main_thread_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process's main thread (the host's event loop; its SQLite thread is apart)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_one(
    kind: str, workers: int, seconds: float, concurrency: int, tag: str, work_us: float = 0.0
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="edgerun-store-bench-") as tmp:
        settings = StoreSettings(
            sqlite_path=str(Path(tmp) / "gateway.sqlite3"), sqlite_shared=kind == "shared",
            store_socket=str(Path(tmp) / "run" / "store.sock") if kind == "hosted" else None,
        )  # fmt: skip
        secret = asyncio.run(_seed(settings))
        host = _start_host(settings) if kind == "hosted" else None
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
        try:
            for child in children:
                child.start()
            barrier.wait(300)
            host0 = (process_cpu_s(host.pid), _main_thread_cpu_s(host.pid)) if host else (0.0, 0.0)
            barrier.wait(300)
            host1 = (process_cpu_s(host.pid), _main_thread_cpu_s(host.pid)) if host else (0.0, 0.0)
            outcomes = [results.get(timeout=120) for _ in children]
            for child in children:
                child.join(timeout=60)
        finally:
            if host is not None:
                host.send_signal(signal.SIGTERM)
                host.wait(timeout=60)
    requests = sum(o[0] for o in outcomes)
    wall = statistics.mean(o[2] for o in outcomes)
    return {
        "req_s": requests / wall,
        "worker_cpu_ms": 1000 * sum(o[1] for o in outcomes) / requests,
        "host_cpu_ms": 1000 * (host1[0] - host0[0]) / requests,
        "host_loop_ms": 1000 * (host1[1] - host0[1]) / requests,
        "lock_ms": 1000 * sum(o[3] for o in outcomes) / requests,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2", help="worker process counts, comma separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per configuration")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight per worker")
    parser.add_argument("--stores", default="embedded,shared,hosted")
    parser.add_argument(
        "--gateway-work-us", type=float, default=0.0,
        help="Python work per request besides the store calls (a gateway's own, ~700 us on 16 idle cores)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    counts = [int(w) for w in args.workers.split(",")]
    configs = [(kind, k) for k in counts for kind in args.stores.split(",") if kind != "embedded" or k == 1]
    print(f"machine: {machine()}")
    print(f"load average before: {os.getloadavg()}")
    runs: dict[tuple[str, int], list[dict[str, float]]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for kind, workers in configs:
            result = run_one(kind, workers, args.seconds, args.concurrency, f"r{r}", args.gateway_work_us)
            runs[(kind, workers)].append(result)
            print(f"  round {r} {kind} x{workers}: " + ", ".join(f"{k} {v:.3f}" for k, v in result.items()), flush=True)
    print(f"load average after: {os.getloadavg()}")
    base = statistics.median(x["req_s"] for x in runs.get(("embedded", 1), [])) if ("embedded", 1) in runs else None
    print(
        "\n| store | workers | req/s | vs embedded | worker CPU ms/req | host CPU ms/req (its loop) "
        "| lock hold ms/req | serial cap req/s |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for (kind, workers), results in runs.items():
        med: dict[str, Any] = {k: statistics.median(x[k] for x in results) for k in results[0]}
        serial = med["host_cpu_ms"] if kind == "hosted" else med["lock_ms"] if kind == "shared" else 0.0
        cap = f"{1000 / serial:,.0f}" if serial else "-"
        ratio = f"{med['req_s'] / base:.2f}x" if base else "-"
        print(
            f"| {kind} | {workers} | {med['req_s']:,.0f} | {ratio} | {med['worker_cpu_ms']:.3f} | "
            f"{med['host_cpu_ms']:.3f} ({med['host_loop_ms']:.3f}) | {med['lock_ms']:.3f} | {cap} |"
        )


if __name__ == "__main__":
    main()
