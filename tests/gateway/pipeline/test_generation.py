"""End to end: a backend killed under the gateway fails over before the first byte, unseen by clients."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from backends.client import BackendOverloaded, BackendRejected, BackendTimeout, BackendUnavailable
from gateway.errors import BUSY_MESSAGE, InvalidInput, OutOfCapacity, RequestTimeout
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.pipeline.generation import backend_error_to_gateway
from tests.gateway.fixtures_e2e import BackendProcess, InProcessGateway, gateway_settings, start_backend


def test_backend_errors_map_to_workers_ai_errors() -> None:
    overloaded = backend_error_to_gateway(BackendOverloaded("b answered 429", retry_after_s=3))
    assert isinstance(overloaded, OutOfCapacity) and overloaded.retry_after_s == 3
    assert isinstance(backend_error_to_gateway(BackendTimeout("slow")), RequestTimeout)
    rejected = backend_error_to_gateway(BackendRejected("b1 answered 400: prompt too long", status=400))
    assert isinstance(rejected, InvalidInput) and "prompt too long" in rejected.message and "b1" not in rejected.message
    down = backend_error_to_gateway(BackendUnavailable("http://10.0.0.5:8100 refused", endpoint_id="b1"))
    assert isinstance(down, OutOfCapacity) and "10.0.0.5" not in down.message
    busy = backend_error_to_gateway(BackendOverloaded("all 2 endpoints are overloaded"), reject_if_busy=True)
    assert isinstance(busy, OutOfCapacity) and busy.message == BUSY_MESSAGE and busy.retry_after_s == 1
    assert backend_error_to_gateway(BackendTimeout("slow"), reject_if_busy=True).code == 3007  # not capacity


@pytest.fixture(scope="module")
def victim() -> Iterator[BackendProcess]:
    backend = start_backend("victim", "near")
    try:
        backend.wait_ready()
        yield backend
    finally:
        backend.stop()


@pytest.fixture(scope="module")
def failover_gateway(
    victim: BackendProcess, backend_pair: list[BackendProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessGateway]:
    """The victim is in the gateway's own region, so it is always tried first; b1 is the fallback.
    Health checks are slow on purpose: only the failed request can reveal the death."""
    b1 = backend_pair[0]
    settings = gateway_settings(
        tmp_path_factory.mktemp("failover"),
        [victim.spec(), {**b1.spec(), "region": "far"}],
        region="near",
        region_fallbacks=["far"],
        health_interval_s=3600,
    )
    gateway = InProcessGateway(settings).start()
    yield gateway
    gateway.stop()


def test_a_killed_backend_fails_over_before_the_first_byte(
    failover_gateway: InProcessGateway, victim: BackendProcess
) -> None:
    gw = failover_gateway
    secret = gw.new_key("tf", "acc-f")
    url = f"{gw.url}/client/v4/accounts/acc-f/ai/run/{DEFAULT_MODEL_ID}"
    headers = {"authorization": f"Bearer {secret}"}
    assert gw.store is not None
    before = httpx.post(url, json={"prompt": "Hello", "max_tokens": 2}, headers=headers, timeout=60)
    assert gw.call(gw.store.ledger.get(before.headers["cf-ray"])).backend_id == "victim"

    victim.kill()
    for stream in (True, False):
        response = httpx.post(
            url, json={"prompt": "Hello again", "max_tokens": 4, "stream": stream}, headers=headers, timeout=60
        )
        assert response.status_code == 200, response.text
        if stream:
            assert '"errors"' not in response.text and response.text.endswith("data: [DONE]\n\n")
        else:
            assert response.json()["success"] is True
        record = gw.call(gw.store.ledger.get(response.headers["cf-ray"]))
        assert record is not None and record.backend_id == "b1" and record.status == "ok"
    metrics = httpx.get(f"{gw.url}/metrics", timeout=10).text
    assert 'edgerun_gateway_failovers_total{backend="b1"} 1.0' in metrics  # the second request skipped the victim
    assert 'edgerun_gateway_backend_healthy{backend="victim",region="near"} 0.0' in metrics
