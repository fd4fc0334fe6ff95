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
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.processes import ChildProcess
from tests.gateway import stub_backend
from tests.gateway.redis_server import delete_prefix, new_prefix
from tests.gateway.stub_backend import create_key, start_gateway

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


async def stream_for(url: str, body: dict[str, object], headers: dict[str, str], duration_s: float) -> Counter[str]:
    """`NUM_CLIENTS` clients at once, each streaming one answer after another for `duration_s`: the
    statuses they got (and each failure's first body)."""
    answers: Counter[str] = Counter()
    deadline = time.monotonic() + duration_s

    async def client(http: httpx.AsyncClient) -> None:
        while time.monotonic() < deadline:
            async with http.stream("POST", url, json=body, headers=headers) as response:
                text = (await response.aread()).decode(errors="replace")
            answers[str(response.status_code) if response.status_code == 200 else f"{response.status_code}: {text[:200]}"] += 1

    limits = httpx.Limits(max_connections=NUM_CLIENTS, max_keepalive_connections=NUM_CLIENTS)
    async with httpx.AsyncClient(limits=limits, timeout=30) as http:
        await asyncio.gather(*(client(http) for _ in range(NUM_CLIENTS)))
    return answers


def test_requests_past_the_redis_connections_wait_for_one_instead_of_failing(gateway: ChildProcess) -> None:
    key = create_key(gateway.url, "acc-pool")
    url = f"{gateway.url}/client/v4/accounts/acc-pool/ai/run/{stub_backend.MODEL_ID}"
    body = {"prompt": stub_backend.PROMPT, "max_tokens": 4, "stream": True}
    answers = asyncio.run(stream_for(url, body, {"authorization": f"Bearer {key}"}, 2.0))
    assert set(answers) == {"200"}, (answers, gateway.log_tail())
    assert answers["200"] >= NUM_CLIENTS  # every client was answered at least once
