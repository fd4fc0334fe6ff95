"""The gateway's request id travels to the backend and becomes its engine request id.

A gateway in front of a tiny real backend over loopback: the id the client reads in `cf-ray` is
the one the backend logs its request under (`cmpl-<id>`), streamed or not, so a gateway log line
can be followed into the backend's.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.fixtures_e2e import BackendProcess, InProcessGateway, gateway_settings, running_tiny_backend

pytestmark = pytest.mark.slow
MODEL = "@cf/test/tiny"


@pytest.fixture(scope="module")
def backend() -> Iterator[BackendProcess]:
    with running_tiny_backend("ids", "--log-level", "info") as process:  # info: one line per finished request
        yield process


@pytest.fixture(scope="module")
def gateway(backend: BackendProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    settings = gateway_settings(
        tmp_path_factory.mktemp("ids"), [backend.spec([MODEL])], models=[{"id": MODEL, "backend_model": "random:tiny"}]
    )
    started = InProcessGateway(settings).start()
    yield started
    started.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_the_backend_runs_the_request_under_the_gateways_id(
    gateway: InProcessGateway, backend: BackendProcess, stream: bool
) -> None:
    account = f"acc-ids-{stream}".lower()
    secret = gateway.new_key(f"tenant-ids-{stream}".lower(), account)
    url = f"{gateway.url}/client/v4/accounts/{account}/ai/run/{MODEL}"
    body = {"prompt": "count to three", "max_tokens": 2, "raw": True, "stream": stream}
    answer = httpx.post(url, json=body, headers={"authorization": f"Bearer {secret}"}, timeout=60)
    assert answer.status_code == 200, answer.text
    request_id = answer.headers["cf-ray"]
    gateway.ledger_record(request_id)  # settled: the backend has sent its last byte
    # The backend logs the request once its stream has ended on its side, which may come a moment after
    # the gateway has read the last chunk and settled: wait for the line rather than race it.
    line = f"request_id=cmpl-{request_id} route=completion outcome=ok"
    deadline = time.monotonic() + 10
    while line not in backend.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert line in backend.log(), backend.log_tail()


def test_the_backend_takes_a_plain_id_and_refuses_an_odd_one(backend: BackendProcess) -> None:
    body = {"model": "random:tiny", "prompt": [1, 2, 3], "max_tokens": 1}
    with httpx.Client(base_url=backend.url, timeout=30) as direct:
        plain = uuid.uuid4().hex
        answer = direct.post("/v1/completions", json=body, headers={"x-request-id": plain})
        assert answer.status_code == 200, answer.text
        assert answer.json()["id"] == f"cmpl-{plain}"
        odd = direct.post("/v1/completions", json=body, headers={"x-request-id": "two words\tand a tab"})
        assert odd.status_code == 200, odd.text
        assert odd.json()["id"].startswith("cmpl-") and "words" not in odd.json()["id"]
