"""More concurrent requests than the gateway has Redis connections, through real processes (`edgerun
serve` on the Redis store, the benchmark stub behind it): every request is answered 200. A request
whose store command finds every connection busy waits for one; it used to fail at once with 503
"the shared store is unreachable" (redis-py's pool raises past its size: 100 by default since redis-py
8.0, which 192 benchmark clients on one worker hit). The pool is made small here so a few dozen
clients for two seconds reach its bound. It is set in the URL (`?max_connections=4`), which redis-py's
`from_url` lets win over the gateway's own `redis_max_connections`: so the bound holds on any gateway,
the one before that setting existed included, and the test fails there."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks import stub_backend
from benchmarks.gateway_overhead import create_key, start_gateway
from benchmarks.raw_load import drive
from cli.processes import ChildProcess
from tests.gateway.redis_server import delete_prefix, new_prefix

pytestmark = pytest.mark.slow
NUM_CLIENTS = 32  # 8 per Redis connection; below every limit of the gateway (in-flight 128, 64 per address)
NUM_CONNECTIONS = 4


@pytest.fixture
def gateway(stub_backend: ChildProcess, redis_url: str, tmp_path: Path) -> Iterator[ChildProcess]:
    """`edgerun serve` on Redis with `NUM_CONNECTIONS` connections, the quick stub as its one backend."""
    prefix = new_prefix()
    env = {"EDGERUN_REDIS_URL": f"{redis_url}?max_connections={NUM_CONNECTIONS}", "EDGERUN_KEY_PREFIX": prefix}
    process = start_gateway(stub_backend.port, tmp_path, env)
    try:
        yield process
    finally:
        process.stop(timeout_s=20)
        delete_prefix(redis_url, prefix)


def test_requests_past_the_redis_connections_wait_for_one_instead_of_failing(gateway: ChildProcess) -> None:
    key = create_key(gateway.url, "acc-pool")
    url = f"{gateway.url}/client/v4/accounts/acc-pool/ai/run/{stub_backend.MODEL_ID}"
    body = {"prompt": stub_backend.PROMPT, "max_tokens": 4, "stream": True}
    phase = asyncio.run(drive("pool", url, body, {"authorization": f"Bearer {key}"}, NUM_CLIENTS, 2.0))
    assert phase.failures_text == "none", (phase.failures_text, phase.samples, gateway.log_tail())
    assert len(phase.latencies_s) >= NUM_CLIENTS  # every client was answered at least once
