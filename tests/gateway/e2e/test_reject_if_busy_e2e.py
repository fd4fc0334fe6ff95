"""`options.rejectIfBusy` through a real gateway and a real backend: a request that cannot start at
once is answered 429 / 3040 "Capacity temporarily exceeded, please try again." at once, where the
same request without it waits for its turn."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cloudflare
import httpx
import openai
import pytest

from gateway.errors import BUSY_MESSAGE
from tests.gateway.fixtures_e2e import (
    BackendProcess,
    InProcessGateway,
    gateway_settings,
    held_stream,
    running_tiny_backend,
)

pytestmark = pytest.mark.slow
TINY = "@cf/test/tiny"  # served by the one-seat backend only
TINY_BOTH = "@cf/test/tiny-both"  # the same, served by it (tried first: the gateway's own region) and another
BUSY = {"options": {"rejectIfBusy": True}}


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[BackendProcess, BackendProcess]]:
    """One with one running seat (max_num_seqs 1) and a queue behind it (the gateway's region "near"); one "far"."""
    with running_tiny_backend("one-seat", "--max-num-seqs", "1", "--max-queue", "4") as near:
        with running_tiny_backend("far") as far:
            yield near, far


@pytest.fixture(scope="module")
def gateway(
    backends: tuple[BackendProcess, BackendProcess], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessGateway]:
    near, far = backends
    models = [{"id": model, "backend_model": "random:tiny"} for model in (TINY, TINY_BOTH)]
    specs = [{**near.spec([TINY, TINY_BOTH]), "region": "near"}, {**far.spec([TINY_BOTH]), "region": "far"}]
    # no health checks after the first: only a request can change what the gateway thinks of a backend
    settings = gateway_settings(tmp_path_factory.mktemp("busy"), specs, models=models, region="near",
                                region_fallbacks=["far"], health_interval_s=3600)
    started = InProcessGateway(settings).start()
    yield started
    started.stop()


def run_url(gw: InProcessGateway, account: str, model: str = TINY) -> str:
    return f"{gw.url}/client/v4/accounts/{account}/ai/run/{model}"


def post(gw: InProcessGateway, account: str, secret: str, body: dict[str, Any], model: str = TINY) -> httpx.Response:
    return httpx.post(run_url(gw, account, model), json={"prompt": "hi", "raw": True, "max_tokens": 2, **body},
                      headers={"authorization": f"Bearer {secret}"}, timeout=60)


def holding_the_seat(gw: InProcessGateway, account: str, secret: str) -> contextlib.AbstractContextManager[None]:
    """A long stream holding the one-seat backend's seat until the block ends."""
    return held_stream(run_url(gw, account), secret, {"prompt": "hello", "raw": True, "max_tokens": 3000,
                                                       "temperature": 0})


def assert_busy_at_once(answer: httpx.Response, started: float) -> None:
    assert time.perf_counter() - started < 2.0, "refused only after a wait"
    assert answer.status_code == 429, answer.text
    assert answer.json()["errors"] == [{"code": 3040, "message": BUSY_MESSAGE}]
    assert float(answer.headers["retry-after"]) >= 1


def test_every_backend_at_its_running_batch_answers_busy_at_once_where_others_wait(gateway: InProcessGateway) -> None:
    assert gateway.store is not None
    secret = gateway.new_key("t-busy", "acc-busy")
    oai = openai.OpenAI(api_key=secret, base_url=f"{gateway.url}/client/v4/accounts/acc-busy/ai/v1", max_retries=0)
    with ThreadPoolExecutor(1) as pool:
        with holding_the_seat(gateway, "acc-busy", secret):
            started = time.perf_counter()
            answer = post(gateway, "acc-busy", secret, BUSY)
            assert_busy_at_once(answer, started)
            assert gateway.call(gateway.store.ledger.get(answer.headers["cf-ray"])) is None  # nothing billed
            with pytest.raises(openai.RateLimitError) as caught:  # /ai/v1: options at the top level
                oai.completions.create(model=TINY, prompt="hi", max_tokens=2, extra_body=BUSY)
            assert caught.value.body == {"message": BUSY_MESSAGE, "type": "rate_limit_error", "param": None,
                                         "code": "3040"}
            cf = cloudflare.Cloudflare(api_token=secret, base_url=f"{gateway.url}/client/v4", max_retries=0)
            with pytest.raises(cloudflare.RateLimitError):  # README's example
                cf.ai.run(TINY, account_id="acc-busy", prompt="hi", raw=True, max_tokens=2, extra_body=BUSY)
            patient = pool.submit(post, gateway, "acc-busy", secret, {})  # no option: it waits in the queue
            time.sleep(1.0)
            assert not patient.done()
            elsewhere = post(gateway, "acc-busy", secret, BUSY, model=TINY_BOTH)  # one-seat is tried first, then far
            assert elsewhere.status_code == 200
            assert gateway.ledger_record(elsewhere.headers["cf-ray"]).backend_id == "far"
            assert gateway.services.monitor.is_healthy("one-seat")  # busy is not down: it stays in the rotation
        # the held stream was abandoned (the backend aborts it): the patient request has its turn
        assert patient.result(timeout=60).status_code == 200
    assert post(gateway, "acc-busy", secret, BUSY).status_code == 200  # a free seat: it runs


def test_a_tenant_at_its_concurrency_limit_answers_busy_at_once(gateway: InProcessGateway) -> None:
    assert gateway.store is not None
    gateway.call(gateway.store.tenancy.create_tenant("t-one", ["acc-one"], tenant_id="t-one", max_concurrent_requests=1))
    secret = gateway.new_key("t-one", "acc-one")
    with holding_the_seat(gateway, "acc-one", secret):
        started = time.perf_counter()
        answer = post(gateway, "acc-one", secret, {"messages": None, **BUSY})
        assert_busy_at_once(answer, started)
        assert gateway.call(gateway.store.ledger.get(answer.headers["cf-ray"])) is None  # refused before any backend
