"""`edgerun serve --workers 2` through real processes, with each shared store: the local store's
SQLite file in its shared mode (the default without Redis: gateway/store/local/shared.py) and Redis.
The benchmark stub is the backend. Requests on fresh connections reach both workers
(`x-edgerun-worker`), each has exactly one ledger record, `edgerun billing export` reads every
worker's records, a key's requests-per-minute hold over both workers together, and a killed worker
is started again while its request slot and in-flight tokens are freed when its lease expires.
SIGTERM to the supervisor lets a stream finish and bill, and ends it with status 0.

One `serve --workers 2` per store serves every test of that store (the module's gateway): the quick
stub behind one model, the slow stub behind another, so a stream can be held open on the slow one
while the checks around it take the quick one."""

from __future__ import annotations

import asyncio
import collections
import csv
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cli.processes import ChildProcess, ProcessError
from gateway.settings import GatewaySettings
from gateway.store import open_store
from tests.gateway import stub_backend
from tests.gateway.redis_server import delete_prefix, new_prefix
from tests.process_tree import command_lines, gateway_pids

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
SLOW_MODEL_ID = "@cf/edgerun/bench-stub-slow"  # served by the slow stub only
PATH = f"/client/v4/accounts/acc-w/ai/run/{stub_backend.MODEL_ID}"
CAPPED_PATH = f"/client/v4/accounts/acc-c/ai/run/{stub_backend.MODEL_ID}"
CAPPED_SLOW_PATH = f"/client/v4/accounts/acc-c/ai/run/{SLOW_MODEL_ID}"
LEASE_S = 9.0  # inflight_lease_s of the gateways here: a killed worker's slot and tokens last this long (renewed every
# third of it, so at least 6 s remain at the kill: the checks just after it hold on a loaded 2-core machine too)


@pytest.fixture(scope="module")
def stub(stub_backend: ChildProcess) -> ChildProcess:
    return stub_backend  # the session's quick stub


@pytest.fixture(scope="module")
def slow_stub(slow_stub_backend: ChildProcess) -> ChildProcess:
    """Answers of 40 chunks 0.1 s apart: a stream still open when its worker is killed."""
    return slow_stub_backend


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def store_env(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The EDGERUN_* settings naming the store every worker shares (a fresh key prefix or file)."""
    if request.param == "sqlite":  # no setting: the workers share the file by default
        yield {"EDGERUN_SQLITE_PATH": str(tmp_path_factory.mktemp(request.param) / "gateway.sqlite3")}
        return
    url = request.getfixturevalue("redis_url")
    prefix = new_prefix()
    yield {"EDGERUN_REDIS_URL": url, "EDGERUN_KEY_PREFIX": prefix}
    delete_prefix(url, prefix)


def _settings(store_env: dict[str, str], **overrides: object) -> GatewaySettings:
    """The same store as the workers', opened here (the CLI's view: one process)."""
    return GatewaySettings(
        redis_url=store_env.get("EDGERUN_REDIS_URL"), key_prefix=store_env.get("EDGERUN_KEY_PREFIX", "edgerun:"),
        sqlite_path=store_env.get("EDGERUN_SQLITE_PATH", ":memory:"), **overrides,  # type: ignore[arg-type]
    )


def _env(stub: ChildProcess, tmp_path: Path, store_env: dict[str, str], slow_stub: ChildProcess | None = None) -> dict[str, str]:
    """The gateway's settings: the quick stub serves MODEL_ID; `slow_stub`, when given, SLOW_MODEL_ID."""
    models = [{"id": stub_backend.MODEL_ID, "backend_model": "stub", "block_size": 16}]
    backends = [{"id": "stub", "base_url": stub.url, "region": "local", "models": [stub_backend.MODEL_ID]}]
    if slow_stub is not None:
        models.append({"id": SLOW_MODEL_ID, "backend_model": "stub", "block_size": 16})
        backends.append({"id": "slow", "base_url": slow_stub.url, "region": "local", "models": [SLOW_MODEL_ID]})
    return {
        "EDGERUN_MODELS": json.dumps(models),
        "EDGERUN_BACKENDS": json.dumps(backends),
        "EDGERUN_SQLITE_PATH": str(tmp_path / "gateway.sqlite3"),
        "EDGERUN_TOKENIZER_CACHE_DIR": str(tmp_path / "tokenizers"),
        "EDGERUN_LOG_LEVEL": "warning",
        "EDGERUN_INFLIGHT_LEASE_S": str(LEASE_S),
        # The stubs' /load always reports nothing in flight, and each poll would correct the store's counts to
        # that: one poll at start, then none during the test, so a killed worker's tokens wait for its lease
        "EDGERUN_LOAD_INTERVAL_S": "600",
        **store_env,
    }


async def _keys(settings: GatewaySettings) -> tuple[str, str, str, str]:
    """Keys of tenant "tw" (no limit, and rpm=10), of tenant "tc" (one request at a time) and of
    tenant "th" (no limit; the SIGTERM test's)."""
    store = open_store(settings.store)
    try:
        await store.tenancy.create_tenant("Workers", ["acc-w"], tenant_id="tw")
        _, free = await store.tenancy.create_key("tw")
        _, limited = await store.tenancy.create_key("tw", rpm=10)
        await store.tenancy.create_tenant("Capped", ["acc-c"], tenant_id="tc", max_concurrent_requests=1)
        _, capped = await store.tenancy.create_key("tc")
        await store.tenancy.create_tenant("Drained", ["acc-h"], tenant_id="th")
        _, drain = await store.tenancy.create_key("th")
        return free, limited, capped, drain
    finally:
        await store.aclose()


async def _records(settings: GatewaySettings, request_ids: list[str]) -> list[object]:
    store = open_store(settings.store)
    try:
        return [await store.ledger.get(request_id) for request_id in request_ids]
    finally:
        await store.aclose()


async def _loads(settings: GatewaySettings) -> dict[str, tuple[int, int]]:
    """In-flight tokens summed over the live workers, as a replica of the same store sees them."""
    store = open_store(settings.store)
    try:
        return await store.routing.loads()
    finally:
        await store.aclose()


def _post(url: str, secret: str, path: str = PATH) -> httpx.Response:
    """A request on a fresh connection (the kernel picks a worker). Tried again on a reset connection: one that the
    kernel queued on a worker just killed is reset (the socket's, not the gateway's, doing)."""
    for attempt in range(3):
        try:
            with httpx.Client(timeout=30) as client:
                return client.post(url + path, json={"prompt": "hi", "max_tokens": 3},
                                   headers={"authorization": f"Bearer {secret}"})
        except (httpx.ReadError, httpx.RemoteProtocolError):
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _wait_for_both_workers(url: str) -> None:
    """Both workers listen: /healthz on fresh connections has answered from each (the first may be up alone)."""
    deadline = time.monotonic() + 60
    seen: set[str] = set()
    while seen != {"0", "1"}:
        assert time.monotonic() < deadline, f"only workers {seen} answered"
        with httpx.Client(timeout=10) as client:
            seen.add(client.get(url + "/healthz").headers["x-edgerun-worker"])


def _children(supervisor_pid: int) -> dict[int, list[bytes]]:
    """The supervisor's children (its workers) -> their command lines."""
    return command_lines(gateway_pids(supervisor_pid))


def _worker_pids(supervisor_pid: int) -> list[int]:
    return [pid for pid, argv in _children(supervisor_pid).items() if b"--worker-index" in argv]


@dataclass
class Workers:
    store: str  # sqlite or redis
    gateway: ChildProcess
    settings: GatewaySettings  # the store, as a lone process opens it
    shared: GatewaySettings  # the store, as one more worker opens it
    env: dict[str, str]
    started: float  # time.monotonic() when the gateway answered first
    secret: str  # tenant tw, no limits
    limited: str  # tenant tw, rpm=10
    capped: str  # tenant tc, one request in flight at a time
    drain_key: str  # tenant th, no limits


@pytest.fixture(scope="module")
def workers(
    stub: ChildProcess, slow_stub: ChildProcess, store_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Workers]:
    """`edgerun serve --workers 2` on the store (ready), in front of both stubs; one per store. Stopped
    with SIGTERM at the end: status 0."""
    store = "redis" if "EDGERUN_REDIS_URL" in store_env else "sqlite"
    tmp_path = tmp_path_factory.mktemp("workers")
    settings = _settings(store_env)
    secret, limited, capped, drain_key = asyncio.run(_keys(settings))
    env = _env(stub, tmp_path, store_env, slow_stub)
    gateway = ChildProcess.spawn("gateway", "serve", ["--workers", "2"], env=env)
    try:
        gateway.wait_ready("/healthz")
        _wait_for_both_workers(gateway.url)
        shared = _settings(store_env, sqlite_shared=True, inflight_lease_s=LEASE_S)  # one more worker
        yield Workers(store, gateway, settings, shared, env, time.monotonic(), secret, limited, capped, drain_key)
    finally:
        gateway.stop(timeout_s=20)
    assert gateway.process.returncode == 0


def _export_request_ids(w: Workers, tmp_path: Path, tenant: str = "tw") -> list[str]:
    """`edgerun billing export` of `tenant`, run as the operator would, on the workers' store."""
    out = tmp_path / "bill.csv"
    command = [sys.executable, "-m", "cli", "billing", "export", "--from", "2020-01-01", "--to", "2100-01-01",
               "--tenant", tenant, "--format", "csv", "--out", str(out)]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EDGERUN_")}, **w.env}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    with out.open(newline="") as rows:
        return [row["request_id"] for row in csv.DictReader(rows)]


def test_two_workers_share_the_port_the_ledger_and_the_limits(workers: Workers, tmp_path: Path) -> None:
    """Tenant tw's requests are this test's alone (the other test takes tenant tc)."""
    gateway = workers.gateway
    answers = [_post(gateway.url, workers.secret) for _ in range(16)]
    assert [a.status_code for a in answers] == [200] * 16
    spread = collections.Counter(a.headers["x-edgerun-worker"] for a in answers)
    assert set(spread) == {"0", "1"}, spread  # 16 fresh connections, both workers (2 * 2**-16 to fail)
    request_ids = [a.headers["cf-ray"] for a in answers]
    records = asyncio.run(_records(workers.settings, request_ids))
    assert all(record is not None for record in records)
    assert len({record.request_id for record in records}) == 16  # type: ignore[attr-defined]
    exported = _export_request_ids(workers, tmp_path)
    assert sorted(exported) == sorted(request_ids)  # every worker's records, each once

    statuses = collections.Counter(_post(gateway.url, workers.limited).status_code for _ in range(14))
    assert statuses == {200: 10, 429: 4}  # rpm=10 over both workers together, not 10 each


def _worker_pid(supervisor_pid: int, index: str) -> int:
    for pid, argv in _children(supervisor_pid).items():
        if b"--worker-index" in argv and argv[argv.index(b"--worker-index") + 1].decode() == index:
            return pid
    raise AssertionError(f"no worker {index}")


def test_a_killed_worker_is_started_again_and_its_slot_and_tokens_are_freed(workers: Workers) -> None:
    w = workers
    gateway = w.gateway
    # past the supervisor's min_uptime_s: a death now is a crash, not a bad start
    time.sleep(max(0.0, w.started + 5.5 - time.monotonic()))
    first = _worker_pids(gateway.process.pid)
    assert len(first) == 2
    with httpx.Client(timeout=30) as client, client.stream(
        "POST", gateway.url + CAPPED_SLOW_PATH, headers={"authorization": f"Bearer {w.capped}"},
        json={"prompt": "hi", "max_tokens": 40, "stream": True},
    ) as stream:
        assert stream.status_code == 200
        # the worker has taken tenant tc's one slot and counted its tokens; `chunks` stays referenced: a discarded
        # iterator is closed at once, which closes the connection, and the worker would end the stream itself
        chunks = stream.iter_bytes()
        next(chunks)
        victim = _worker_pid(gateway.process.pid, stream.headers["x-edgerun-worker"])
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        del chunks  # the client goes away only now, after its worker
    # the dead worker's tokens and slot (any model of tenant tc) count until their lease ends
    assert asyncio.run(_loads(w.shared)).get("slow", (0, 0)) != (0, 0)
    assert _post(gateway.url, w.capped, CAPPED_PATH).status_code == 429
    deadline = killed_at + LEASE_S + 20
    while (answer := _post(gateway.url, w.capped, CAPPED_PATH)).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.25)
    freed_after = time.monotonic() - killed_at
    assert answer.status_code == 200, answer.text
    assert freed_after < LEASE_S + 20
    # the dead worker's tokens go with their own lease, renewed when they last changed (at the first chunk, a
    # little after the slot's): nothing in flight soon after the slot is free, within the same deadline
    while (loads := asyncio.run(_loads(w.shared))) and time.monotonic() < deadline:
        time.sleep(0.25)
    assert loads == {}

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = _worker_pids(gateway.process.pid)
        if len(now) == 2 and victim not in now:
            break
        time.sleep(0.2)
    assert len(now) == 2 and victim not in now and set(first) - {victim} <= set(now)
    gateway.wait_ready("/healthz")
    seen = set()
    while time.monotonic() < deadline and seen != {"0", "1"}:
        answer = _post(gateway.url, w.capped, CAPPED_PATH)
        assert answer.status_code == 200
        seen.add(answer.headers["x-edgerun-worker"])
    assert seen == {"0", "1"}  # the restarted worker serves again


def test_workers_cannot_share_a_memory_database(stub: ChildProcess, tmp_path: Path) -> None:
    env = {**_env(stub, tmp_path, {}), "EDGERUN_SQLITE_PATH": ":memory:"}
    gateway = ChildProcess.spawn("gateway", "serve", ["--workers", "2"], env=env)
    try:
        with pytest.raises(ProcessError, match="not ':memory:'"):
            gateway.wait_ready("/healthz", timeout_s=30)
    finally:
        gateway.stop(timeout_s=10)


@pytest.mark.parametrize("store_env", ["sqlite"], indirect=True)  # the last test of the sqlite gateway: it stops it
def test_sigterm_lets_a_stream_finish_and_bill_before_it_stops(workers: Workers) -> None:
    """SIGTERM to the supervisor in the middle of a stream: the stream ends in full, the supervisor exits 0, and the
    stream's record is in the ledger file."""
    w = workers
    gateway = w.gateway
    with httpx.Client(timeout=60) as client, client.stream(
        "POST", gateway.url + f"/client/v4/accounts/acc-h/ai/run/{SLOW_MODEL_ID}",
        headers={"authorization": f"Bearer {w.drain_key}"}, json={"prompt": "hi", "max_tokens": 40, "stream": True},
    ) as stream:
        assert stream.status_code == 200
        chunks = stream.iter_bytes()
        first = next(chunks)
        gateway.process.send_signal(signal.SIGTERM)
        body = first + b"".join(chunks)
    assert body.rstrip().endswith(b"data: [DONE]")
    assert gateway.process.wait(timeout=60) == 0
    assert asyncio.run(_records(w.settings, [stream.headers["cf-ray"]])) != [None]
