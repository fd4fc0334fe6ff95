"""Request bodies: bounded before reading, JSON objects only."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.errors import GatewayError
from gateway.http.body import read_json_object
from gateway.http.envelopes import error_response

MAX = 1024


async def echo(request: Request) -> Response:
    return JSONResponse(await read_json_object(request, MAX))


async def render(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return error_response(exc, openai=False)


@pytest.fixture
def client() -> TestClient:
    return TestClient(Starlette(routes=[Route("/", echo, methods=["POST"])], exception_handlers={GatewayError: render}))


def test_object_passes(client: TestClient) -> None:
    assert client.post("/", json={"a": 1}).json() == {"a": 1}


@pytest.mark.parametrize(
    ("content", "status", "code"),
    [
        (b"", 400, 3003),
        (b"{not json", 400, 5004),
        (b"[1, 2]", 400, 5004),
        (b"\xff\xfe", 400, 5004),
        (json.dumps({"x": "y" * MAX}).encode(), 413, 3006),
    ],
)
def test_bad_bodies_get_the_documented_code(client: TestClient, content: bytes, status: int, code: int) -> None:
    response = client.post("/", content=content)
    assert response.status_code == status
    assert response.json()["errors"][0]["code"] == code


def test_chunked_body_is_cut_off_at_the_bound(client: TestClient) -> None:
    def chunks():  # noqa: ANN202 - no Content-Length: the server only learns the size by reading
        for _ in range(100):
            yield b" " * 512

    response = client.post("/", content=chunks())
    assert response.status_code == 413
    assert response.json()["errors"][0]["code"] == 3006
