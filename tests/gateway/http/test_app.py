"""The app's own routes and error rendering (no backend needed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.http.app import create_app
from gateway.settings import GatewaySettings


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = GatewaySettings(redis_url=None, sqlite_path=str(tmp_path / "g.sqlite3"), tokenizer_cache_dir=None)
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_unknown_routes_get_the_cloudflare_no_route_error(client: TestClient) -> None:
    missing = client.get("/client/v4/accounts/a/ai/nothing")
    assert missing.status_code == 404
    assert missing.json()["errors"] == [
        {"code": 7000, "message": "No route for that URI: GET /client/v4/accounts/a/ai/nothing"}
    ]
    wrong_method = client.get("/client/v4/accounts/a/ai/v1/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.headers["allow"] == "POST"
    assert wrong_method.json()["error"]["code"] == "7000"  # OpenAI shape under /ai/v1/


def test_healthz_and_metrics(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok", "backends": {}, "billing": []}
    refused = client.get("/metrics")  # no metrics_token, not metrics_public, no admin listener
    assert refused.status_code == 401 and "metrics_token" in refused.json()["errors"][0]["message"]
    services = client.app.state.services
    services.settings = services.settings.model_copy(
        update={"http": services.settings.http.model_copy(update={"metrics_public": True})}
    )
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'edgerun_gateway_requests_total{model="",route="/healthz",status="200"} 1.0' in metrics.text


def test_the_admin_api_is_off_without_a_token(client: TestClient) -> None:
    response = client.get("/admin/v1/tenants", headers={"authorization": "Bearer anything"})
    assert response.status_code == 401
