"""SIGTERM to a gateway process with streams in flight (a slow stub backend behind it): the open
streams finish, new requests get 503 with Retry-After meanwhile, every stream has its one ledger
record, and the process exits; streams still open at `shutdown_timeout_s` are cut and billed
for what they got. (The backend's own drain: tests/backends/test_lifecycle.py.)"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from cli.processes import ChildProcess
from gateway.settings import GatewaySettings
from gateway.store import open_store
from gateway.store.models import UsageRecord
from tests.gateway import stub_backend
from tests.gateway.fixtures_e2e import GatewayProcess, start_gateway_process

pytestmark = pytest.mark.slow

NUM_STREAMS = 6


@pytest.fixture(scope="module")
def slow_stub(slow_stub_backend: ChildProcess) -> ChildProcess:
    return slow_stub_backend  # 4-second streams


def start(slow_stub: ChildProcess, tmp_path: Path, shutdown_timeout_s: float) -> tuple[GatewayProcess, str, Path]:
    sqlite = tmp_path / "gateway.sqlite3"

    async def make_key() -> str:
        store = open_store(GatewaySettings(redis_url=None, sqlite_path=str(sqlite)).store)
        try:
            await store.tenancy.create_tenant("drain", ["acc-drain"], tenant_id="t-drain")
            return (await store.tenancy.create_key("t-drain"))[1]
        finally:
            await store.aclose()

    secret = asyncio.run(make_key())
    env = {
        **stub_backend.gateway_env(slow_stub.port),
        "EDGERUN_SQLITE_PATH": str(sqlite),
        "EDGERUN_TOKENIZER_CACHE_DIR": str(tmp_path / "tokenizers"),
        "EDGERUN_SHUTDOWN_TIMEOUT_S": str(shutdown_timeout_s),
        "EDGERUN_LOG_JSON": "false",
    }
    gateway = start_gateway_process(env)
    gateway.wait_ready()
    return gateway, secret, sqlite


def url(gateway: GatewayProcess) -> str:
    return f"{gateway.url}/client/v4/accounts/acc-drain/ai/run/{stub_backend.MODEL_ID}"


def stream(gateway: GatewayProcess, secret: str, first: threading.Barrier) -> tuple[str, list[str]]:
    """One streamed request: (its request id, its SSE lines); waits at `first` after the first chunk."""
    lines: list[str] = []
    body = {"prompt": "hello", "stream": True, "max_tokens": 64}
    try:
        with httpx.stream("POST", url(gateway), json=body, headers={"authorization": f"Bearer {secret}"},
                          timeout=30) as response:
            request_id = response.headers["cf-ray"]
            for line in response.iter_lines():
                if line.startswith("data: "):
                    lines.append(line)
                    if len(lines) == 1:
                        first.wait(timeout=30)
    except httpx.HTTPError:
        pass  # cut at the deadline: what arrived is in `lines`
    return request_id, lines


def records(sqlite: Path) -> dict[str, UsageRecord]:
    async def read() -> list[UsageRecord]:
        store = open_store(GatewaySettings(redis_url=None, sqlite_path=str(sqlite)).store)
        try:
            return [r async for r in store.ledger.iter_usage(0, time.time() + 60)]
        finally:
            await store.aclose()

    return {r.request_id: r for r in asyncio.run(read())}


def streams_open(gateway: GatewayProcess, secret: str) -> tuple[list[Future[tuple[str, list[str]]]], ThreadPoolExecutor]:
    first = threading.Barrier(NUM_STREAMS + 1)
    pool = ThreadPoolExecutor(NUM_STREAMS)
    futures = [pool.submit(stream, gateway, secret, first) for _ in range(NUM_STREAMS)]
    first.wait(timeout=60)  # every stream has its first chunk
    return futures, pool


def test_sigterm_drains_open_streams_and_refuses_new_requests(slow_stub: ChildProcess, tmp_path: Path) -> None:
    gateway, secret, sqlite = start(slow_stub, tmp_path, shutdown_timeout_s=30)
    try:
        futures, pool = streams_open(gateway, secret)
        started = time.monotonic()
        gateway.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # the signal lands
        refused = httpx.post(url(gateway), json={"prompt": "hi"}, headers={"authorization": f"Bearer {secret}"})
        assert refused.status_code == 503 and refused.json()["errors"][0]["code"] == 3043, refused.text
        assert refused.headers["retry-after"] == "1" and refused.headers["connection"] == "close"
        results = [f.result(timeout=60) for f in futures]
        pool.shutdown()
        assert gateway.process.wait(timeout=30) == 0
        drained_s = time.monotonic() - started
    finally:
        gateway.stop()
    for _, lines in results:
        assert lines[-1] == "data: [DONE]", lines[-3:]
        assert json.loads(lines[-2][6:])["usage"]["completion_tokens"] > 0
    ledger = records(sqlite)
    assert {request_id for request_id, _ in results} == set(ledger)  # one each, none for the refused one
    assert all(r.status == "ok" for r in ledger.values())
    assert drained_s < 30  # the drain ended when the streams did, not at its deadline
    print(f"drain: {NUM_STREAMS} streams in flight at SIGTERM, all completed, 1 new request refused 503, "
          f"exit {drained_s:.2f} s after the signal")


def test_streams_still_open_at_the_drain_deadline_are_cut_and_billed(slow_stub: ChildProcess, tmp_path: Path) -> None:
    gateway, secret, sqlite = start(slow_stub, tmp_path, shutdown_timeout_s=0.5)
    try:
        futures, pool = streams_open(gateway, secret)
        gateway.process.send_signal(signal.SIGTERM)
        results = [f.result(timeout=60) for f in futures]
        pool.shutdown()
        assert gateway.process.wait(timeout=30) == 0
    finally:
        gateway.stop()
    ledger = records(sqlite)
    assert {request_id for request_id, _ in results} == set(ledger)
    print(f"drain deadline: {NUM_STREAMS} streams cut at shutdown_timeout_s=0.5, "
          f"{sum(len(lines) for _, lines in results)} chunks delivered, all {len(ledger)} billed as cancelled")
    for request_id, lines in results:
        assert lines[-1] != "data: [DONE]"  # cut before its end
        assert ledger[request_id].status == "cancelled" and ledger[request_id].completion_tokens > 0
