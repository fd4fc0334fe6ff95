"""The store host as its own process (`python -m gateway.store.host`), with workers as real
processes: a killed worker's slots and tokens are freed at once, a host that goes away is a quick
StoreUnavailable and a restarted one is used again without restarting the worker, SIGTERM commits
the ledger and exits 0, and four workers racing on one host never exceed a limit (process_race.py)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.synchronize import Barrier
from pathlib import Path

import pytest

from gateway.billing.metering import Metering
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from gateway.store import StoreUnavailable, UsageRecord
from gateway.store.embedded import EmbeddedStore
from gateway.store.host.client import HostedStore
from gateway.store.host.process import start_host
from gateway.store.settings import StoreSettings
from tests.gateway.store.process_race import race, run_racers
from tests.gateway.test_metering import PRICES, request_for

pytestmark = pytest.mark.slow


def _settings(tmp_path: Path, **overrides: object) -> StoreSettings:
    return GatewaySettings(
        redis_url=None,
        sqlite_path=str(tmp_path / "gateway.sqlite3"),
        store_socket=str(tmp_path / "run" / "store.sock"),
        **overrides,
    ).store


def _start_host(settings: StoreSettings) -> subprocess.Popen[bytes]:
    env = {**os.environ, "EDGERUN_SQLITE_PATH": settings.sqlite_path, "EDGERUN_LOG_JSON": "false"}
    env.pop("EDGERUN_REDIS_URL", None)
    assert settings.store_socket is not None
    return start_host(settings.store_socket, env)


@pytest.fixture
def host_settings(tmp_path: Path) -> Iterator[StoreSettings]:
    settings = _settings(tmp_path)
    host = _start_host(settings)
    yield settings
    if host.poll() is None:
        host.kill()
    host.wait()


async def _until(predicate: object, within_s: float = 5.0) -> None:
    """Poll an async predicate until it holds (a bound far under any lease, not a timing claim)."""
    deadline = time.monotonic() + within_s
    while not await predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.02)


_WORKER = """
import asyncio, sys
from gateway.billing.metering import Metering
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from gateway.store import open_store

async def main():
    store = open_store(GatewaySettings(redis_url=None, sqlite_path=sys.argv[1], store_socket=sys.argv[2]).store)
    assert await store.acquire_request_slot("acme", "killed-1", 2)
    assert await store.acquire_request_slot("acme", "killed-2", 2)
    await store.add_inflight("X", 100, 10)
    print("holding", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_killed_workers_slots_and_tokens_are_freed_at_once(host_settings: StoreSettings) -> None:
    assert host_settings.inflight_lease_s == 15.0  # the shared store's killed worker holds on this long
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, host_settings.sqlite_path, str(host_settings.store_socket)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    live = HostedStore(host_settings)
    try:
        assert worker.stdout is not None and worker.stdout.readline() == b"holding\n"
        await live.add_inflight("X", 5, 1)
        assert await live.loads() == {"X": (105, 11)}
        assert not await live.acquire_request_slot("acme", "live-1", 2)  # the worker holds both
        worker.send_signal(signal.SIGKILL)
        worker.wait()

        async def freed() -> bool:
            return await live.loads() == {"X": (5, 1)}

        await _until(freed)  # the host saw the connection close: well within the lease it would wait for
        assert await live.acquire_request_slot("acme", "live-1", 2)
        assert await live.acquire_request_slot("acme", "live-2", 2)
        assert not await live.acquire_request_slot("acme", "live-3", 2)  # the live worker's own slots stay
    finally:
        worker.kill()
        worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()
        await live.aclose()


async def test_a_host_gone_is_unavailable_and_a_restarted_one_is_used_again(tmp_path: Path) -> None:
    settings = _settings(tmp_path, redis_timeout_s=1.0, sqlite_busy_timeout_s=1.0)
    host = _start_host(settings)
    store = HostedStore(settings)
    try:
        tenant = await store.create_tenant("Acme", ["a1"], tenant_id="acme")
        host.kill()
        host.wait()
        for _ in range(2):  # the lost connection, then the refused reconnect: each an error at once, no hang
            with pytest.raises(StoreUnavailable, match="store host"):
                await asyncio.wait_for(store.get_tenant_by_account("a2"), 5)
        assert await store.get_tenant("acme") == tenant  # a tenant never changes: the worker keeps it
        host = _start_host(settings)  # replaces the dead host's socket file
        assert await store.list_tenants() == [tenant]  # the same client reconnects on its own; SQLite kept it
        assert await store.get_tenant_by_account("a2") is None
    finally:
        await store.aclose()
        host.kill()
        host.wait()


async def test_sigterm_answers_commits_the_ledger_and_exits_0(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    host = _start_host(settings)
    store = HostedStore(settings)
    record = UsageRecord(
        request_id="req-1", tenant_id="acme", account_id="a1", key_id="key_a", model="m", region=None,
        backend_id="b1", session_id=None, started_at=1.0, ended_at=2.0, status="ok", prompt_tokens=3,
        cached_tokens=0, completion_tokens=4, price_version="v1", cost_micro=7, metadata={"team": "x"},
    )  # fmt: skip
    try:
        assert await store.append_usage(record)
        assert not await store.append_usage(record)  # once only
        host.send_signal(signal.SIGTERM)
        assert host.wait(timeout=30) == 0
        assert not Path(str(settings.store_socket)).exists()  # removed on exit
    finally:
        await store.aclose()
        host.kill()
    reopened = EmbeddedStore(settings)
    try:
        assert await reopened.get_usage("req-1") == record
    finally:
        await reopened.aclose()


def _child(
    settings: StoreSettings, index: int, barrier: Barrier, results: multiprocessing.Queue[tuple[int, int, int]]
) -> None:
    results.put(asyncio.run(race(HostedStore(settings), index, barrier)))


def test_processes_racing_on_one_host_never_exceed_a_limit(host_settings: StoreSettings) -> None:
    run_racers(_child, host_settings)
    asyncio.run(_check_after_the_race(host_settings))


async def _check_after_the_race(settings: StoreSettings) -> None:
    store = HostedStore(settings)
    try:
        assert await store.budget_spent("acme", "2026-11") == 700
        assert await store.acquire_request_slot("acme", "after", 50)  # the children closed: their slots freed
    finally:
        await store.aclose()


_UVLOOP_WORKER = """
import sys, uvloop
from gateway.billing.metering import Metering
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from gateway.store import open_store

async def main():
    store = open_store(GatewaySettings(redis_url=None, sqlite_path=sys.argv[1], store_socket=sys.argv[2]).store)
    assert await store.acquire_request_slot("acme", "uv-1", 1)
    assert not await store.acquire_request_slot("acme", "uv-2", 1)
    await store.aclose()
    print("ok", flush=True)

uvloop.run(main())
"""


def test_a_worker_on_uvloop_reaches_the_host(host_settings: StoreSettings) -> None:
    # The gateway's workers run on uvloop (uvicorn's default where installed), whose transports
    # are not asyncio.Transport instances: the client must not depend on that.
    assert host_settings.store_socket is not None
    done = subprocess.run(
        [sys.executable, "-c", _UVLOOP_WORKER, host_settings.sqlite_path, host_settings.store_socket],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_a_second_host_on_one_sqlite_file_is_refused_until_the_first_stops(tmp_path: Path) -> None:
    """Two `serve --workers N` on different ports get a socket each but, by default, one SQLite
    file: two hosts would each keep limits and budgets in memory (twice every limit) and each
    write its own month's spend over the other's."""
    first = _settings(tmp_path)
    second = first.model_copy(update={"store_socket": str(tmp_path / "other" / "store.sock")})
    host = _start_host(first)
    try:
        try:
            extra = _start_host(second)
        except RuntimeError as exc:
            refused = str(exc)
        else:
            extra.kill()
            extra.wait()
            refused = "served"
        assert "exited with status 1" in refused
    finally:
        host.terminate()
        host.wait()
    after = _start_host(second)  # the first host's claim ended with it
    after.terminate()
    assert after.wait() == 0


async def test_a_reservation_answered_after_its_timeout_is_given_back(tmp_path: Path) -> None:
    """The host, stopped (SIGSTOP) past the worker's timeout, applies the reservation once it runs
    again: the worker's request failed (503) and will never settle it, so the worker gives it back
    when the late answer comes. 100 stays reserved, so a give-back made twice would show (0, not 100),
    and so would one of a reservation refused late (nothing was reserved)."""
    settings = _settings(tmp_path, redis_timeout_s=0.5, sqlite_busy_timeout_s=0.5)  # 1 s: a loaded machine answers in time
    host = _start_host(settings)
    store = HostedStore(settings)
    try:
        assert (await store.reserve_budget("acme", "2026-11", 100, 1000)).allowed  # connected; stays reserved
        host.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable, match="did not answer"):
                await asyncio.wait_for(store.reserve_budget("acme", "2026-11", 50, 1000), 5)
        finally:
            host.send_signal(signal.SIGCONT)
        reserved = [await store.budget_spent("acme", "2026-11")]  # the host runs the reservation first

        async def given_back() -> bool:
            reserved.append(await store.budget_spent("acme", "2026-11"))
            return reserved[-1] == 100

        await _until(given_back)
        assert reserved[0] == 150  # it did land late
        await asyncio.sleep(0.3)
        assert await store.budget_spent("acme", "2026-11") == 100  # once
        host.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(StoreUnavailable, match="did not answer"):  # over the budget: refused, late
                await asyncio.wait_for(store.reserve_budget("acme", "2026-11", 950, 1000), 5)
        finally:
            host.send_signal(signal.SIGCONT)
        await asyncio.sleep(0.5)
        assert await store.budget_spent("acme", "2026-11") == 100  # nothing reserved, nothing given back
    finally:
        await store.aclose()
        host.kill()
        host.wait()


@pytest.mark.parametrize("late", [False, True], ids=["answered-in-time", "answered-late"])
async def test_a_cancelled_callers_reservation_is_given_back_once(tmp_path: Path, late: bool) -> None:
    """A client leaves while its reservation waits on a stopped host. Answered in time, Metering
    gives it back (its cancelled caller's); answered after the timeout, the hosted store does
    (Metering saw StoreUnavailable). Never both: 5000 stays reserved, so a second give-back of the
    900 would show as 4100."""
    timeouts = {"redis_timeout_s": 0.5, "sqlite_busy_timeout_s": 0.5} if late else {"redis_timeout_s": 10.0}
    settings = _settings(tmp_path, **timeouts)
    host = _start_host(settings)
    store = HostedStore(settings)
    metering = Metering(store, PRICES, GatewayMetrics())
    try:
        request = await request_for(store, budget=10_000)
        month = time.strftime("%Y-%m", time.gmtime(request.ctx.arrived_at))
        assert (await store.reserve_budget("ta", month, 5000, 10_000)).allowed
        host.send_signal(signal.SIGSTOP)
        try:
            caller = asyncio.ensure_future(metering.reserve(request, max_tokens=100))  # 1000 x 0.60 + 100 x 3 = 900
            await asyncio.sleep(0.05)  # sent, not answered
            caller.cancel()
            with pytest.raises(asyncio.CancelledError):
                await caller
            if late:
                await asyncio.wait_for(metering.aclose(), 5)  # timed out: Metering has nothing to give back
        finally:
            host.send_signal(signal.SIGCONT)
        # sent at once, behind the reservation and before any give-back (which waits for its answer)
        spent = [await store.budget_spent("ta", month)]
        await asyncio.wait_for(metering.aclose(), 10)

        async def given_back() -> bool:
            spent.append(await store.budget_spent("ta", month))
            return spent[-1] == 5000

        await _until(given_back)
        await asyncio.sleep(0.3)
        assert await store.budget_spent("ta", month) == 5000  # once
        assert spent[0] == 5900  # it landed (late: after the timeout), then went back
    finally:
        await store.aclose()
        host.kill()
        host.wait()
