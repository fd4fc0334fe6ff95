"""A streamed request asks the store at most seven times, each one round trip on Redis (issue 31):
authenticate, count the request (rpm), look up its route, admit it, record where it started, its
first token, settle it. Counted with a wrapper around the real store, behind a real gateway and
the stub backend (tests/gateway/stub_backend.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.processes import ChildProcess
from tests.gateway.fixtures_e2e import InProcessGateway, gateway_settings
from tests.gateway.store.counting import Counts, counted
from tests.gateway.stub_backend import MODEL_ID as STUB_MODEL

pytestmark = pytest.mark.slow

EXPECTED = [
    "tenancy.authenticate",
    "admission.check_and_consume",  # the request, against the key's rpm, before its body is read
    "routing.lookup",
    "admission.admit",  # slot, tpm, budget, in-flight tokens
    "routing.started",  # session and prefix, where the backend answered
    "routing.release_inflight",  # the first token: its prompt is prefilled
    "admission.settle",  # slot, in-flight, tpm, budget back; the ledger record
]


@pytest.fixture(params=["local", "redis"])
def counted_gateway(
    request: pytest.FixtureRequest, stub_backend: ChildProcess, tmp_path: Path
) -> Iterator[tuple[InProcessGateway, Counts]]:
    redis = {"redis_url": request.getfixturevalue("redis_url"), "key_prefix": request.getfixturevalue("redis_prefix")} \
        if request.param == "redis" else {}
    backends = [{"id": "stub", "base_url": stub_backend.url, "region": "local", "models": [STUB_MODEL]}]
    models = [{"id": STUB_MODEL, "backend_model": "stub", "block_size": 16}]
    # background loops (health, /load, KV events) far apart: only the request's own calls are counted
    settings = gateway_settings(tmp_path, backends, models=models, health_interval_s=3600, load_interval_s=3600,
                                kv_events_interval_s=3600, **redis)
    counts = Counts()
    gateway = InProcessGateway(settings, wrap_store=lambda store: counted(store, counts)).start()
    try:
        yield gateway, counts
    finally:
        gateway.stop()


def test_a_streamed_request_makes_seven_store_calls_each_one_round_trip(
    counted_gateway: tuple[InProcessGateway, Counts],
) -> None:
    gateway, counts = counted_gateway
    assert gateway.store is not None
    # a tenant with a budget and a concurrency limit, a key with both per-minute limits: every part is asked for
    gateway.call(gateway.store.tenancy.create_tenant("t-calls", ["acc-calls"], tenant_id="t-calls",
                                                      monthly_budget_micro=10**9, max_concurrent_requests=10))
    secret = gateway.new_key("t-calls", "acc-calls", rpm=1000, tpm=100_000)
    url = f"{gateway.url}/client/v4/accounts/acc-calls/ai/run/{STUB_MODEL}"
    body = {"prompt": "Hello there", "max_tokens": 8, "stream": True}
    headers = {"authorization": f"Bearer {secret}", "x-session-affinity": "chat-1"}
    for _ in range(2):  # the first also loads the tokenizer, the cache salt and Redis's scripts
        counts.reset()
        with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        deadline = time.monotonic() + 10
        while "admission.settle" not in counts.round_trips_after and time.monotonic() < deadline:
            time.sleep(0.01)
    assert counts.calls == EXPECTED
    assert len(counts.calls) <= 7
    if gateway.settings.store.redis_url:
        assert counts.round_trips_after["admission.settle"] == len(EXPECTED)  # one round trip each
    assert gateway.ledger_record(response.headers["cf-ray"]).status == "ok"
