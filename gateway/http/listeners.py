"""Where the gateway listens: the public listener, and optionally a separate admin listener.

With `admin_port` set, one process serves two uvicorn servers in one event loop over one app
(one lifespan, one set of services): the public listener (`host:port`) answers the inference
API, and the admin listener (`admin_host:admin_port`, loopback by default) answers `/admin/...`
and `/metrics`. Each path is served where it belongs and is a plain 404 on the other listener:

    path                    public listener           admin listener
    /client/v4/...          yes                       404
    /admin/..., /metrics    404 (yes without split)   yes
    anything else           yes                       yes   (/healthz, /dashboard)

Each request's scope names the listener it came in on (`listener_of`), so a route on both (the
dashboard) can accept the admin token on the admin listener only (`accepts_admin_token`). Without
`admin_port` there is one listener and it accepts everything, as before. Both listeners enforce
`gateway.http.listener_limits`, each with its own connection counts and its own `max_connections`,
fitted under the process's open-file limit (`gateway.http.descriptors`: the admin listener keeps
descriptors of its own when the public one is full).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
from collections.abc import Coroutine, Iterator
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import NoRoute
from gateway.http.descriptors import fitted_caps
from gateway.http.drain import Drain
from gateway.http.envelopes import error_response
from gateway.http.listener_limits import limited_protocol

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

LISTENER_KEY = "edgerun.listener"
PUBLIC, ADMIN = "public", "admin"


def listener_of(scope: Scope) -> str:
    """The listener a request came in on ("public" when untagged, e.g. under a test client)."""
    listener: str = scope.get(LISTENER_KEY, PUBLIC)
    return listener


def is_admin_path(path: str) -> bool:
    return path.startswith("/admin/") or path == "/metrics"


def is_public_api_path(path: str) -> bool:
    return path.startswith("/client/")


def accepts_admin_token(connection: HTTPConnection) -> bool:
    """Whether a route on both listeners may honour the admin token for this request: always with
    one listener, only on the admin listener when there are two."""
    split = connection.app.state.services.settings.http.admin_port is not None
    return not split or listener_of(connection.scope) == ADMIN


class Tagged:
    """Marks every scope with the listener's name (`listener_of`)."""

    def __init__(self, app: ASGIApp, name: str) -> None:
        self.app = app
        self.name = name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope[LISTENER_KEY] = self.name
        await self.app(scope, receive, send)


class ListenerGate:
    """Middleware: a path served on the other listener is a 404 here (only when split)."""

    def __init__(self, app: ASGIApp, split: bool) -> None:
        self.app = app
        self.split = split

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.split and scope["type"] == "http" and not self._belongs(scope):
            error = NoRoute(f"No route for that URI: {scope['method']} {scope['path']}")
            await error_response(error, openai="/ai/v1/" in scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _belongs(scope: Scope) -> bool:
        path = scope["path"]
        if listener_of(scope) == ADMIN:
            return not is_public_api_path(path)
        return not is_admin_path(path)


def listener_configs(
    gateway_settings: GatewaySettings,
    app: ASGIApp,
    *,
    port: int | None = None,
    admin_port: int | None = None,
) -> list[uvicorn.Config]:
    """uvicorn configs, public first (it runs the app's lifespan); `port`/`admin_port` override the
    settings' (tests pick free ports). Each listener's max_connections fits the open-file limit."""
    settings, limits = gateway_settings.http, gateway_settings.listener_limits
    admin = admin_port if admin_port is not None else settings.admin_port
    caps = fitted_caps(gateway_settings, has_admin=admin is not None)
    common = {
        "log_config": None,  # keep our structured logging
        "access_log": False,  # the gateway's middleware logs each request with its request id
        "timeout_keep_alive": int(max(1, limits.keep_alive_s)),
        "timeout_graceful_shutdown": 1,  # a backstop: `Drain` already waited for the requests in flight
        "backlog": settings.listen_backlog,  # connections the kernel holds until accepted (capped by somaxconn)
    }
    listeners = [(PUBLIC, settings.host, port if port is not None else settings.port, caps.public)]
    if admin is not None and caps.admin is not None:
        listeners.append((ADMIN, settings.admin_host, admin, caps.admin))
    return [
        uvicorn.Config(
            Tagged(app, name), host=host, port=number, lifespan="on" if name == PUBLIC else "off",
            http=limited_protocol(limits.model_copy(update={"max_connections": cap}), name), **common,  # type: ignore[arg-type]
        )
        for name, host, number, cap in listeners
    ]


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # `Listeners.serve` stops every server at once
        yield


def reuse_port_socket(config: uvicorn.Config) -> socket.socket:
    """A socket bound to the config's address with SO_REUSEPORT: several processes bind the same
    port and the kernel spreads new connections over them (`edgerun serve --workers`)."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((config.host, config.port))
    sock.set_inheritable(False)
    return sock


class Listeners:
    """Serves several uvicorn configs in this event loop: the first (with the lifespan) starts
    first and stops last, so the other listeners never run without the services. With
    `reuse_port`, each listener binds its port with SO_REUSEPORT (one of several worker processes)."""

    def __init__(self, configs: list[uvicorn.Config], drain: Drain | None = None, *, reuse_port: bool = False) -> None:
        self.servers = [_Server(config) for config in configs]
        self.drain = drain  # the app's (`app.state.drain`): run when asked to stop, before the servers stop
        self._stopping = asyncio.Event()
        self._reuse_port = reuse_port

    def _serve(self, server: uvicorn.Server) -> Coroutine[Any, Any, None]:
        return server.serve(sockets=[reuse_port_socket(server.config)] if self._reuse_port else None)

    @property
    def started(self) -> bool:
        return all(server.started for server in self.servers)

    def run(self) -> None:
        """`serve` on a new event loop of the kind uvicorn would pick (uvloop when installed)."""
        with asyncio.Runner(loop_factory=self.servers[0].config.get_loop_factory()) as runner:
            runner.run(self.serve())

    def stop(self) -> None:
        """Ask every listener to finish (call on the serving loop)."""
        self._stopping.set()

    async def serve(self) -> None:
        first, *rest = self.servers
        tasks = [asyncio.create_task(self._serve(first))]
        with self._signals():
            while not first.started and not tasks[0].done():
                await asyncio.sleep(0.02)
            if not tasks[0].done():
                tasks += [asyncio.create_task(self._serve(server)) for server in rest]
            stopping = asyncio.create_task(self._stopping.wait())
            await asyncio.wait([*tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
            if stopping.done() and self.drain is not None and not any(t.done() for t in tasks):
                await self.drain.run()
            stopping.cancel()
            for server, task in reversed(list(zip(self.servers, tasks, strict=False))):
                server.should_exit = True  # the admin listener drains first, then the public one
                await asyncio.wait([task])
        for task in tasks:
            task.result()  # re-raise a server's failure (e.g. SystemExit when a port is taken)

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
