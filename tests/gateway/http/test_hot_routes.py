"""gateway.http.hot_routes: POST routes served directly, the same exception handlers, the rest to Starlette."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

from gateway.http.hot_routes import HotRoutes


class Refused(Exception):
    pass


async def echo(request: Request) -> Response:
    return JSONResponse({"model": request.path_params["model"], "route": request.scope["route"].path})


async def refuse(request: Request) -> Response:
    raise Refused("no")


async def crash(request: Request) -> Response:
    raise RuntimeError("bug")


async def render_refused(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(f"refused: {exc}", status_code=403)


def make() -> TestClient:
    """Starlette itself knows only a GET route: whatever a POST gets, HotRoutes answered."""
    hot = [
        Route("/run/{model:path}", echo, methods=["POST"]),
        Route("/refuse", refuse, methods=["POST"]),
        Route("/crash", crash, methods=["POST"]),
    ]
    app = Starlette(routes=[Route("/run/{model:path}", echo, methods=["GET"])])
    app.add_middleware(HotRoutes, routes=hot, handlers={Exception: crash_handler, Refused: render_refused})
    return TestClient(app, raise_server_exceptions=False)


async def crash_handler(request: Request, exc: Exception) -> Response:
    return PlainTextResponse(f"handled: {exc!r}", status_code=500)


def test_a_post_route_is_served_with_its_params_and_route() -> None:
    answer = make().post("/run/@cf/meta/llama")
    assert answer.json() == {"model": "@cf/meta/llama", "route": "/run/{model:path}"}


def test_an_exception_goes_to_the_handler_of_its_nearest_class() -> None:
    client = make()
    refused = client.post("/refuse")
    assert (refused.status_code, refused.text) == (403, "refused: no")
    crashed = client.post("/crash")
    assert (crashed.status_code, crashed.text) == (500, "handled: RuntimeError('bug')")


def test_other_methods_and_paths_go_on_to_starlette() -> None:
    client = make()
    assert client.get("/run/x").json() == {"model": "x", "route": "/run/{model:path}"}
    assert client.put("/run/x").status_code == 405
    assert client.post("/elsewhere").status_code == 404
