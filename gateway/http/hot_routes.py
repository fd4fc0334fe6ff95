"""The inference routes served in one step, without Starlette's exception and routing layers.

Every request still passes the gateway's own middleware (request id and metrics, drain, listener
gate: gateway/http/middleware.py, drain.py, listeners.py). Past them, Starlette would run for each
request its `ExceptionMiddleware`, the router's match over the route list and `request_response`'s
exception wrapper, the first and last each wrapping `send` once more: a measurable part of a
streamed request's CPU. `HotRoutes` does their job for the POST routes that carry the traffic:
match the route, call its endpoint, render an exception the app has a handler for (the same
handlers, gateway/http/app.py) and send the response. Anything else goes on to Starlette
unchanged, so every other route, 404 and 405 behaves as before.

One difference, on purpose: an exception raised while the response is being sent is not given to
the handlers (Starlette refuses to once the response has started, and the gateway's responses start
before they can fail); it goes to the request middleware, which logs it and answers 500 if nothing
was sent yet.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

ExceptionHandler = Callable[[Request, Exception], Awaitable[Response]]


class HotRoutes:
    """Middleware: serves `routes` (POST only; async function endpoints, awaited as they are) directly;
    everything else goes on to `app`."""

    def __init__(
        self, app: ASGIApp, routes: Sequence[Route], handlers: Mapping[type[Exception], ExceptionHandler]
    ) -> None:
        self.app = app
        self.routes = [route for route in routes if route.methods == {"POST"}]
        self.handlers = dict(handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            for route in self.routes:
                match, child_scope = route.matches(scope)
                if match is Match.FULL:
                    scope.update(child_scope)
                    scope["route"] = route  # what the request middleware counts by
                    await self._serve(route, scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _serve(self, route: Route, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive, send)
        try:
            response: Response = await route.endpoint(request)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            response = await handler(request, exc)
            exc.__traceback__ = None  # a reused exception would pile up tracebacks (as Starlette does)
        await response(scope, receive, send)

    def _handler(self, exc: Exception) -> ExceptionHandler | None:
        """The handler of the nearest class in `exc`'s MRO, as Starlette looks it up."""
        for cls in type(exc).__mro__:
            found = self.handlers.get(cls)
            if found is not None:
                return found
        return None
