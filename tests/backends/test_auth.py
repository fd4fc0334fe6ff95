"""The backend's bearer check (backends/server/auth.py) on tiny inline apps, and the start-up rule."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from backends.server.auth import BearerAuth, InsecureBinding, check_exposure, is_loopback


async def ok(request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


def client(api_key: str | None) -> httpx.AsyncClient:
    routes = [Route("/health", ok), Route("/v1/models", ok), Route("/kv_cache_events", ok, methods=["POST"])]
    app = BearerAuth(Starlette(routes=routes), api_key)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://backend")


async def test_every_route_but_health_needs_the_key() -> None:
    async with client("s3cret") as http:
        assert (await http.get("/health")).status_code == 200
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"},
                        {"authorization": "Bearer s3cret "}, {"authorization": "Basic s3cret"}):
            answer = await http.get("/v1/models", headers=headers)
            assert answer.status_code == 401, headers
            error = answer.json()["error"]
            assert error["type"] == "authentication_error" and error["code"] == 401 and "Bearer" in error["message"]
            assert answer.headers["www-authenticate"].startswith("Bearer")
        assert (await http.post("/kv_cache_events")).status_code == 401
        assert (await http.post("/health")).status_code == 401  # only GET /health is open
        good = {"authorization": "Bearer s3cret"}
        assert (await http.get("/v1/models", headers=good)).text == "ok"
        assert (await http.post("/kv_cache_events", headers=good)).status_code == 200


async def test_no_key_configured_lets_everyone_in() -> None:
    async with client(None) as http:
        assert (await http.get("/v1/models")).status_code == 200


def test_only_loopback_may_listen_without_a_key() -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert is_loopback(host)
        check_exposure(host, None, allow_unauthenticated=False)
    for host in ("0.0.0.0", "::", "10.0.0.5", "backend.internal"):
        assert not is_loopback(host)
        with pytest.raises(InsecureBinding, match="EDGERUN_API_KEY"):
            check_exposure(host, None, allow_unauthenticated=False)
        check_exposure(host, "s3cret", allow_unauthenticated=False)
        check_exposure(host, None, allow_unauthenticated=True)


def test_short_secrets_are_refused_with_a_hint() -> None:
    from backends.settings import BackendSettings
    from gateway.settings import GatewaySettings

    with pytest.raises(ValueError, match="openssl rand"):
        BackendSettings(api_key="short")
    with pytest.raises(ValueError, match="EDGERUN_BACKEND_API_KEY"):
        GatewaySettings(backend_api_key="short")
    with pytest.raises(ValueError, match="EDGERUN_CACHE_SALT_SECRET"):
        GatewaySettings(cache_salt_secret="short")
    assert BackendSettings(api_key="x" * 16).api_key is not None


def test_the_unauthenticated_mooncake_transport_needs_the_operator_to_vouch_for_the_network() -> None:
    from backends.settings import BackendSettings

    with pytest.raises(ValueError, match="authenticates no one"):
        BackendSettings(kv_transport="mooncake")
    assert BackendSettings(kv_transport="mooncake", kv_mooncake_trusted_network=True).kv_transport == "mooncake"
    assert BackendSettings().kv_transport == "tcp"  # the default signs every pull
