"""`edgerun serve --workers 2` through real processes: the benchmark stub as the backend, Redis as
the shared store. Requests on fresh connections reach both workers (`x-edgerun-worker`), each
has exactly one ledger record, and a key's requests-per-minute hold over both workers together.
The embedded store refuses more than one worker."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
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


def test_two_workers_share_the_port_the_ledger_and_the_limits(
    stub: ChildProcess, redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    settings = GatewaySettings(redis_url=redis_url, key_prefix=redis_prefix)
    secret, limited = asyncio.run(_keys(settings))
    env = _env(stub, tmp_path, EDGERUN_REDIS_URL=redis_url, EDGERUN_KEY_PREFIX=redis_prefix)
    gateway = ChildProcess.spawn("gateway", "serve", ["--workers", "2"], env=env)
    try:
        gateway.wait_ready("/healthz")
        answers = [_post(gateway.url, secret) for _ in range(16)]
        assert [a.status_code for a in answers] == [200] * 16
        workers = collections.Counter(a.headers["x-edgerun-worker"] for a in answers)
        assert set(workers) == {"0", "1"}, workers  # 16 fresh connections, both workers (2 * 2**-16 to fail)
        request_ids = [a.headers["cf-ray"] for a in answers]
        records = asyncio.run(_records(settings, request_ids))
        assert all(record is not None for record in records)
        assert len({record.request_id for record in records}) == 16  # type: ignore[attr-defined]

        statuses = collections.Counter(_post(gateway.url, limited).status_code for _ in range(14))
        assert statuses == {200: 10, 429: 4}  # rpm=10 over both workers together, not 10 each
    finally:
        gateway.stop(timeout_s=20)
    assert gateway.process.returncode == 0


def test_more_than_one_worker_needs_redis(stub: ChildProcess, tmp_path: Path) -> None:
    gateway = ChildProcess.spawn("gateway", "serve", ["--workers", "2"], env=_env(stub, tmp_path))
    try:
        with pytest.raises(ProcessError, match="needs the Redis store"):
            gateway.wait_ready("/healthz", timeout_s=30)
    finally:
        gateway.stop(timeout_s=10)
