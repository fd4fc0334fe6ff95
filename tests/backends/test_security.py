"""A backend started with an API key, over real HTTP: who may call it, and what its KV events reveal."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from backends.client import BackendClient, BackendRejected, Endpoint
from cli.processes import ROOT
from tests.backends.conftest import BackendProcess, running_backend

pytestmark = pytest.mark.slow
KEY = "backend-test-secret-0123456789"
AUTH = {"authorization": f"Bearer {KEY}"}
RING = 16  # KV events the backend keeps for its readers


@pytest.fixture(scope="module")
def backend() -> Iterator[BackendProcess]:
    env = {"EDGERUN_API_KEY": KEY, "EDGERUN_KV_EVENTS_CAPACITY": str(RING)}
    with running_backend("--model", "random:tiny", "--num-kv-blocks", "256", env=env) as process:
        yield process


@pytest.fixture(scope="module")
def http(backend: BackendProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=backend.url, timeout=60) as client:
        yield client


ROUTES = [
    ("POST", "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
    ("GET", "/v1/models", None),
    ("GET", "/metrics", None),
    ("GET", "/load", None),
    ("POST", "/kv_cache_events", None),
    ("GET", "/edgerun/v1/tokenizer", None),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[path for _, path, _ in ROUTES])
def test_every_route_but_health_needs_the_key(http: httpx.Client, method: str, path: str, body: dict | None) -> None:
    for headers in ({}, {"authorization": "Bearer not-the-key"}):
        answer = http.request(method, path, json=body, headers=headers)
        assert answer.status_code == 401, (path, answer.text)
        assert answer.json()["error"]["type"] == "authentication_error"
    assert http.request(method, path, json=body, headers=AUTH).status_code == 200


def test_health_is_open_to_probes(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200


def test_kv_events_carry_no_token_ids_and_every_consumer_gets_them(http: httpx.Client) -> None:
    for consumer in ("gw-a", "gw-b"):  # both start reading now
        http.post("/kv_cache_events", params={"consumer": consumer}, headers=AUTH)
    http.post("/kv_cache_events", headers=AUTH)  # the plain poll (trtllm's) is a consumer too
    prompt = [10 + i for i in range(48)]  # the tiny random model's vocabulary has 512 ids
    body = {"prompt": prompt, "max_tokens": 1, "cache_salt": "salt-x"}
    assert http.post("/v1/completions", json=body, headers=AUTH).status_code == 200
    seen = {}
    for consumer in ("gw-a", "gw-b", None):
        params = {"consumer": consumer} if consumer else {}
        events = http.post("/kv_cache_events", params=params, headers=AUTH).json()
        blocks = [b for e in events if e["data"]["type"] == "stored" for b in e["data"]["blocks"]]
        assert len(blocks) >= 3, events  # 48 tokens = 3 full blocks of 16
        assert all(b["tokens"] == [] and isinstance(b["block_hash"], int) for b in blocks)  # hashes only
        seen[consumer] = [b["block_hash"] for b in blocks]
        assert http.post("/kv_cache_events", params=params, headers=AUTH).json() == []  # read once per consumer
    assert seen["gw-a"] == seen["gw-b"] == seen[None]
    bad = http.post("/kv_cache_events", params={"consumer": "a b"}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "consumer"


def test_a_full_event_ring_drops_the_oldest_and_counts_them(http: httpx.Client) -> None:
    http.post("/kv_cache_events", params={"consumer": "slow"}, headers=AUTH)
    for i in range(RING + 4):  # each request stores at least one block under its own salt
        body = {"prompt": [20 + i] * 20, "max_tokens": 1, "cache_salt": f"ring-{i}"}
        assert http.post("/v1/completions", json=body, headers=AUTH).status_code == 200
    assert len(http.post("/kv_cache_events", params={"consumer": "slow"}, headers=AUTH).json()) == RING
    metrics = http.get("/metrics", headers=AUTH).text
    [dropped] = [line for line in metrics.splitlines() if line.startswith("edgerun_backend_kv_events_dropped_total")]
    assert float(dropped.split()[-1]) >= 4


def test_a_backend_refuses_to_listen_beyond_loopback_without_a_key() -> None:
    command = [sys.executable, "-m", "cli", "backend", "--model", "random:tiny", "--host", "0.0.0.0"]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "EDGERUN_LOG_JSON": "false"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "EDGERUN_API_KEY" in done.stderr and "0.0.0.0" in done.stderr


async def test_the_gateways_client_sends_the_key_on_every_request(backend: BackendProcess) -> None:
    endpoint = Endpoint(id="keyed", base_url=backend.url, region="local")
    keyed, anonymous = BackendClient(api_key=KEY), BackendClient()
    try:
        assert await keyed.health(endpoint) and await anonymous.health(endpoint)
        for client, ok in ((keyed, True), (anonymous, False)):
            for call in (client.load, client.models, client.tokenizer, client.kv_cache_events):
                if ok:
                    await call(endpoint)
                else:
                    with pytest.raises(BackendRejected, match="401"):
                        await call(endpoint)
        body = {"prompt": [5, 6, 7], "max_tokens": 2}
        text, _, usage = await keyed.complete(endpoint, body)
        assert usage.completion_tokens == 2
        _, stream = await keyed.stream_with_failover([endpoint], body)
        assert [chunk async for chunk in stream]
        with pytest.raises(BackendRejected, match="401"):
            await anonymous.stream_with_failover([endpoint], body)
        assert await keyed.kv_cache_events(endpoint, consumer="gw-client") is not None
    finally:
        await keyed.aclose()
        await anonymous.aclose()
