"""Overload through a real gateway and real backends: a tenant at its concurrency limit, and a
gateway at its cap of backend connections, answer 429 / 3040 at once, with Retry-After, and
leave no ledger record (nothing reached a backend)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import httpx
import pytest

from gateway.fleet.catalog import DEFAULT_MODEL_ID
from tests.gateway.fixtures_e2e import BackendProcess, InProcessGateway, gateway_settings, held_stream

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def capped(backend_pair: list[BackendProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    backends = [b.spec() for b in backend_pair]
    settings = gateway_settings(tmp_path_factory.mktemp("capped"), backends, backend_max_connections=2,
                                tenant_max_concurrent_requests=8)
    started = InProcessGateway(settings).start()
    yield started
    started.stop()


def key(gw: InProcessGateway, tenant: str, max_concurrent: int | None = None) -> str:
    assert gw.store is not None
    gw.call(gw.store.tenancy.create_tenant(tenant, [f"acc-{tenant}"], tenant_id=tenant, max_concurrent_requests=max_concurrent))
    _, secret = gw.call(gw.store.tenancy.create_key(tenant))
    return secret


def url(gw: InProcessGateway, tenant: str) -> str:
    return f"{gw.url}/client/v4/accounts/acc-{tenant}/ai/run/{DEFAULT_MODEL_ID}"


def open_stream(gw: InProcessGateway, tenant: str, secret: str) -> contextlib.AbstractContextManager[None]:
    """A long stream, held open (first chunk read) until the block ends, then abandoned."""
    body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "raw": True, "max_tokens": 1500,
            "temperature": 0.0}  # counting on: no early end of sequence
    return held_stream(url(gw, tenant), secret, body)


def refused_at_once(gw: InProcessGateway, tenant: str, secret: str, message: str) -> str:
    started = time.perf_counter()
    answer = httpx.post(url(gw, tenant), json={"prompt": "hi", "max_tokens": 2},
                        headers={"authorization": f"Bearer {secret}"}, timeout=60)
    assert time.perf_counter() - started < 2.0, "refused only after a wait"
    assert answer.status_code == 429, answer.text
    error = answer.json()["errors"][0]
    assert error["code"] == 3040 and message in error["message"], error
    assert 1 <= int(answer.headers["retry-after"]) <= 5
    return answer.headers["cf-ray"]


def no_record(gw: InProcessGateway, request_id: str) -> bool:
    assert gw.store is not None
    time.sleep(0.3)  # a record would be written as the request ends
    return gw.call(gw.store.ledger.get(request_id)) is None


def test_a_tenant_at_its_concurrency_limit_is_refused_and_others_are_not(capped: InProcessGateway) -> None:
    one, other = key(capped, "t-one", max_concurrent=1), key(capped, "t-other")
    with open_stream(capped, "t-one", one):
        request_id = refused_at_once(capped, "t-one", one, "1 concurrent request")
        ok = httpx.post(url(capped, "t-other"), json={"prompt": "hi", "max_tokens": 2},
                        headers={"authorization": f"Bearer {other}"}, timeout=60)
        assert ok.status_code == 200, ok.text
    assert no_record(capped, request_id)
    deadline = time.monotonic() + 10  # the abandoned stream frees its slot as it settles
    while (again := httpx.post(url(capped, "t-one"), json={"prompt": "hi", "max_tokens": 2},
                               headers={"authorization": f"Bearer {one}"}, timeout=60)).status_code == 429:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert again.status_code == 200, again.text


def test_a_gateway_at_its_connection_cap_answers_429_at_once_without_a_ledger_row(capped: InProcessGateway) -> None:
    first, second, late = key(capped, "t-c1"), key(capped, "t-c2"), key(capped, "t-c3")
    with open_stream(capped, "t-c1", first), open_stream(capped, "t-c2", second):
        request_id = refused_at_once(capped, "t-c3", late, "backend_max_connections")
    assert no_record(capped, request_id)
