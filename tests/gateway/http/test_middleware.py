"""Request ids, metrics and last-resort errors, on a tiny app."""

from __future__ import annotations

import time
import uuid

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.http.middleware import RequestContextMiddleware, new_request_id
from gateway.metrics import GatewayMetrics


async def ok(request: Request) -> Response:
    request.state.model = "@cf/test/m"
    return PlainTextResponse(request.state.request_id)


async def boom(request: Request) -> Response:
    raise RuntimeError("bug")


def make() -> tuple[TestClient, GatewayMetrics]:
    metrics = GatewayMetrics()
    app = Starlette(routes=[Route("/ok/{x}", ok), Route("/client/v4/accounts/a/ai/v1/boom", boom)])
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
    return TestClient(app, raise_server_exceptions=False), metrics


def test_every_response_carries_a_fresh_request_id() -> None:
    client, _ = make()
    first, second = client.get("/ok/1"), client.get("/ok/2")
    assert first.headers["cf-ray"] == first.text and len(first.text) == 32
    assert first.headers["x-request-id"] == first.text
    assert second.headers["cf-ray"] != first.headers["cf-ray"]


def test_a_client_request_id_is_echoed_but_never_reused_as_ours() -> None:
    client, _ = make()
    response = client.get("/ok/1", headers={"x-request-id": "client-abc.1"})
    assert response.headers["x-request-id"] == "client-abc.1"
    assert response.headers["cf-ray"] == response.text != "client-abc.1"
    junk = client.get("/ok/1", headers={"x-request-id": "bad id\twith spaces"})
    assert junk.headers["x-request-id"] == junk.text


def test_requests_are_counted_by_route_template_status_and_model() -> None:
    client, metrics = make()
    client.get("/ok/1")
    client.get("/ok/2")
    client.get("/missing")
    assert (
        metrics.registry.get_sample_value(
            "edgerun_gateway_requests_total", {"route": "/ok/{x}", "status": "200", "model": "@cf/test/m"}
        )
        == 2
    )
    assert (
        metrics.registry.get_sample_value(
            "edgerun_gateway_requests_total", {"route": "unmatched", "status": "404", "model": ""}
        )
        == 1
    )


def test_unhandled_errors_become_a_500_envelope_with_the_request_id() -> None:
    client, _ = make()
    response = client.get("/client/v4/accounts/a/ai/v1/boom")
    assert response.status_code == 500
    body = response.json()
    assert body["error"]["code"] == "3043"  # OpenAI shape under /ai/v1/
    assert response.headers["cf-ray"] in body["error"]["message"]


def test_request_ids_are_time_ordered_version_7_uuids() -> None:
    """The ledger's key: ids made later sort later (appended to its index), and none repeats."""
    before_ms = time.time_ns() // 1_000_000
    first = [new_request_id() for _ in range(2000)]
    time.sleep(0.002)
    later = new_request_id()
    after_ms = time.time_ns() // 1_000_000
    parsed = uuid.UUID(later)
    assert (parsed.version, parsed.variant) == (7, uuid.RFC_4122)
    assert all(len(i) == 32 and uuid.UUID(i).version == 7 for i in first)
    assert len(set(first)) == len(first)
    assert later > max(first)
    assert before_ms <= int(first[0][:12], 16) <= int(later[:12], 16) <= after_ms
