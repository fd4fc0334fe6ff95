"""`edgerun serve --workers 2` through real processes: the benchmark stub as the backend, Redis as
the shared store. Requests on fresh connections reach both workers (`x-edgerun-worker`), each
has exactly one ledger record, and a key's requests-per-minute hold over both workers together.
The embedded store refuses more than one worker."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from benchmarks import stub_backend
from benchmarks.gateway_overhead import start_stub
from cli.processes import ChildProcess, ProcessError
from gateway.settings import GatewaySettings
from gateway.store import open_store

pytestmark = pytest.mark.slow
PATH = f"/client/v4/accounts/acc-w/ai/run/{stub_backend.MODEL_ID}"


@pytest.fixture(scope="module")
def stub() -> Iterator[ChildProcess]:
    process = start_stub(3)
    yield process
    process.stop(timeout_s=10)


def _env(stub: ChildProcess, tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        **stub_backend.gateway_env(stub.port),
        "EDGERUN_SQLITE_PATH": str(tmp_path / "gateway.sqlite3"),
        "EDGERUN_TOKENIZER_CACHE_DIR": str(tmp_path / "tokenizers"),
        "EDGERUN_LOG_LEVEL": "warning",
        **extra,
    }


async def _keys(settings: GatewaySettings) -> tuple[str, str]:
    """Two keys of one tenant: no limit, and rpm=10."""
    store = open_store(settings)
    try:
        await store.create_tenant("Workers", ["acc-w"], tenant_id="tw")
        _, free = await store.create_key("tw")
        _, limited = await store.create_key("tw", rpm=10)
        return free, limited
    finally:
        await store.aclose()


async def _records(settings: GatewaySettings, request_ids: list[str]) -> list[object]:
    store = open_store(settings)
    try:
        return [await store.get_usage(request_id) for request_id in request_ids]
    finally:
        await store.aclose()


def _post(url: str, secret: str) -> httpx.Response:
    with httpx.Client(timeout=30) as client:  # a fresh connection each time: the kernel picks a worker
        return client.post(
            url + PATH, json={"prompt": "hi", "max_tokens": 3}, headers={"authorization": f"Bearer {secret}"}
        )


@dataclass
class Workers:
    gateway: ChildProcess
    settings: GatewaySettings
    secret: str  # a key without limits
    limited: str  # a key with rpm=10


@pytest.fixture
def workers(stub: ChildProcess, redis_url: str, redis_prefix: str, tmp_path: Path) -> Iterator[Workers]:
    """`edgerun serve --workers 2` on Redis (ready), with two keys of one tenant."""
    settings = GatewaySettings(redis_url=redis_url, key_prefix=redis_prefix)
    secret, limited = asyncio.run(_keys(settings))
    env = _env(stub, tmp_path, EDGERUN_REDIS_URL=redis_url, EDGERUN_KEY_PREFIX=redis_prefix)
    gateway = ChildProcess.spawn("gateway", "serve", ["--workers", "2"], env=env)
    try:
        gateway.wait_ready("/healthz")
        yield Workers(gateway, settings, secret, limited)
    finally:
        gateway.stop(timeout_s=20)
    assert gateway.process.returncode == 0


def test_two_workers_share_the_port_the_ledger_and_the_limits(workers: Workers) -> None:
    gateway, settings, secret, limited = workers.gateway, workers.settings, workers.secret, workers.limited
    answers = [_post(gateway.url, secret) for _ in range(16)]
    assert [a.status_code for a in answers] == [200] * 16
    spread = collections.Counter(a.headers["x-edgerun-worker"] for a in answers)
    assert set(spread) == {"0", "1"}, spread  # 16 fresh connections, both workers (2 * 2**-16 to fail)
    request_ids = [a.headers["cf-ray"] for a in answers]
    records = asyncio.run(_records(settings, request_ids))
    assert all(record is not None for record in records)
    assert len({record.request_id for record in records}) == 16  # type: ignore[attr-defined]

    statuses = collections.Counter(_post(gateway.url, limited).status_code for _ in range(14))
    assert statuses == {200: 10, 429: 4}  # rpm=10 over both workers together, not 10 each


def test_a_worker_that_dies_is_started_again(workers: Workers) -> None:
    import os
    import signal
    import time

    from benchmarks.workers import worker_pids

    gateway, secret = workers.gateway, workers.secret
    time.sleep(5.5)  # past the supervisor's min_uptime_s: a death now is a crash, not a bad start
    first = worker_pids(gateway.process.pid)
    assert len(first) == 2
    os.kill(first[0], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = worker_pids(gateway.process.pid)
        if len(now) == 2 and first[0] not in now:
            break
        time.sleep(0.2)
    assert len(now) == 2 and first[0] not in now and first[1] in now
    gateway.wait_ready("/healthz")
    seen = set()
    while time.monotonic() < deadline and seen != {"0", "1"}:
        answer = _post(gateway.url, secret)
        assert answer.status_code == 200
        seen.add(answer.headers["x-edgerun-worker"])
    assert seen == {"0", "1"}  # the restarted worker serves again


def test_more_than_one_worker_needs_redis(stub: ChildProcess, tmp_path: Path) -> None:
    gateway = ChildProcess.spawn("gateway", "serve", ["--workers", "2"], env=_env(stub, tmp_path))
    try:
        with pytest.raises(ProcessError, match="needs the Redis store"):
            gateway.wait_ready("/healthz", timeout_s=30)
    finally:
        gateway.stop(timeout_s=10)
