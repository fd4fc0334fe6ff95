"""Every way a generation can end settles its holds exactly once (gateway.pipeline.holds).

A gateway in its region "near" in front of tiny real backends on loopback: `near1` (tried first
for @cf/test/tiny, killed for the failover case), `far` (the fallback, and the only server of a
model whose backend name it does not know, so it refuses before the first byte) and `doomed`
(killed while it streams). Each case counts the settles of its request id.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest

from gateway.pipeline.holds import Holds, Outcome
from tests.gateway.fixtures_e2e import BackendProcess, InProcessGateway, gateway_settings, running_tiny_backend

pytestmark = pytest.mark.slow
TINY, WRONG, DOOMED = "@cf/test/tiny", "@cf/test/wrong", "@cf/test/doomed"


@pytest.fixture(scope="module")
def near1() -> Iterator[BackendProcess]:
    with running_tiny_backend("near1", "--region", "near") as process:
        yield process


@pytest.fixture(scope="module")
def far() -> Iterator[BackendProcess]:
    with running_tiny_backend("far", "--region", "far") as process:
        yield process


@pytest.fixture(scope="module")
def doomed() -> Iterator[BackendProcess]:
    with running_tiny_backend("doomed", "--region", "near") as process:
        yield process


@pytest.fixture(scope="module")
def gateway(
    near1: BackendProcess, far: BackendProcess, doomed: BackendProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessGateway]:
    settings = gateway_settings(
        tmp_path_factory.mktemp("settle"),
        [
            {**near1.spec([TINY]), "region": "near"},
            {**far.spec([TINY, WRONG]), "region": "far"},
            {**doomed.spec([DOOMED]), "region": "near"},
        ],
        models=[
            {"id": TINY, "backend_model": "random:tiny"},
            {"id": WRONG, "backend_model": "no-such-model"},
            {"id": DOOMED, "backend_model": "random:tiny"},
        ],
        region="near",
        region_fallbacks=["far"],
        health_interval_s=3600,  # only the failed requests reveal a death
    )
    started = InProcessGateway(settings).start()
    yield started
    started.stop()


@pytest.fixture
def settles(monkeypatch: pytest.MonkeyPatch) -> Counter[tuple[str, str]]:
    """(request id, status) -> how many settles released holds (a repeated settle does nothing)."""
    counted: Counter[tuple[str, str]] = Counter()
    real = Holds.settle

    async def counting(self: Holds, outcome: Outcome) -> bool:
        released = await real(self, outcome)
        if released:
            counted[(self.request_id, outcome.status)] += 1
        return released

    monkeypatch.setattr(Holds, "settle", counting)
    return counted


def post(gw: InProcessGateway, model: str, body: dict[str, object], tenant: str) -> httpx.Response:
    secret = gw.new_key(tenant, f"acc-{tenant}")
    url = f"{gw.url}/client/v4/accounts/acc-{tenant}/ai/run/{model}"
    return httpx.post(url, json=body, headers={"authorization": f"Bearer {secret}"}, timeout=60)


def settled_once(gw: InProcessGateway, settles: Counter[tuple[str, str]], request_id: str, status: str) -> None:
    assert gw.ledger_record(request_id).status == status
    assert [(key, n) for key, n in settles.items() if key[0] == request_id] == [((request_id, status), 1)]


@pytest.mark.parametrize("stream", [False, True])
def test_an_answered_request(gateway: InProcessGateway, settles: Counter[tuple[str, str]], stream: bool) -> None:
    answer = post(gateway, TINY, {"prompt": "hello", "max_tokens": 3, "raw": True, "stream": stream}, f"ok-{stream}".lower())
    assert answer.status_code == 200, answer.text
    settled_once(gateway, settles, answer.headers["cf-ray"], "ok")


def test_a_client_that_leaves_mid_stream(gateway: InProcessGateway, settles: Counter[tuple[str, str]]) -> None:
    secret = gateway.new_key("gone", "acc-gone")
    url = f"{gateway.url}/client/v4/accounts/acc-gone/ai/run/{TINY}"
    body = {"prompt": "hello", "max_tokens": 3000, "raw": True, "stream": True, "temperature": 0}
    with httpx.stream("POST", url, json=body, headers={"authorization": f"Bearer {secret}"}, timeout=60) as answer:
        request_id = answer.headers["cf-ray"]
        next(answer.iter_lines())  # the first chunk, then the client hangs up
    settled_once(gateway, settles, request_id, "cancelled")


def test_a_backend_that_refuses_before_the_first_byte(gateway: InProcessGateway, settles: Counter[tuple[str, str]]) -> None:
    answer = post(gateway, WRONG, {"prompt": "hello", "max_tokens": 3, "raw": True}, "refused")
    assert answer.status_code >= 400
    settled_once(gateway, settles, answer.headers["cf-ray"], "rejected")


def test_a_backend_that_dies_mid_stream(
    gateway: InProcessGateway, doomed: BackendProcess, settles: Counter[tuple[str, str]]
) -> None:
    secret = gateway.new_key("doom", "acc-doom")
    url = f"{gateway.url}/client/v4/accounts/acc-doom/ai/run/{DOOMED}"
    body = {"prompt": "hello", "max_tokens": 3000, "raw": True, "stream": True, "temperature": 0}
    with httpx.stream("POST", url, json=body, headers={"authorization": f"Bearer {secret}"}, timeout=60) as answer:
        request_id = answer.headers["cf-ray"]
        lines = answer.iter_lines()
        next(lines)
        doomed.kill()
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert "errors" in events[-1]  # the stream ended with an error event, not [DONE]
    settled_once(gateway, settles, request_id, "backend_error")


def test_a_failover_to_the_next_backend(
    gateway: InProcessGateway, near1: BackendProcess, settles: Counter[tuple[str, str]]
) -> None:
    first = post(gateway, TINY, {"prompt": "hi", "max_tokens": 2, "raw": True}, "fo-before")
    assert gateway.ledger_record(first.headers["cf-ray"]).backend_id == "near1"
    near1.kill()
    answer = post(gateway, TINY, {"prompt": "hi", "max_tokens": 2, "raw": True}, "fo")
    assert answer.status_code == 200, answer.text
    request_id = answer.headers["cf-ray"]
    settled_once(gateway, settles, request_id, "ok")
    assert gateway.ledger_record(request_id).backend_id == "far"
