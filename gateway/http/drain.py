"""Graceful shutdown's first phase: drain the requests in flight, refuse new ones with 503.

uvicorn alone, on SIGTERM, closes its listening sockets at once and gives open requests a fixed
grace period. The gateway drains first instead: `Drain.run` (started by `Listeners` on the
signal) makes `DrainGate` answer every new request 503 / 3043 with `Retry-After` and
`Connection: close` (so a load balancer and the clients move to another replica; `/healthz` says
503 too), lets the requests in flight finish until `shutdown_timeout_s`, and only then lets
uvicorn stop, which gives what is still open one more second (its `timeout_graceful_shutdown`)
and then cuts it: each cut stream still writes its ledger record, billed for what was generated. `/metrics` keeps answering while draining.
"""

from __future__ import annotations

import asyncio
import time

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import ServiceUnavailable
from gateway.http.envelopes import error_response

log = structlog.get_logger("edgerun.gateway.drain")

DRAIN_RETRY_AFTER_S = 1.0


class Drain:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.is_draining = False
        self.num_in_flight = 0
        self._idle: asyncio.Event | None = None  # made on the serving loop, when draining starts

    def enter(self) -> None:
        self.num_in_flight += 1

    def leave(self) -> None:
        self.num_in_flight -= 1
        if self.num_in_flight == 0 and self._idle is not None:
            self._idle.set()

    async def run(self) -> bool:
        """Refuse new requests and wait for those in flight, at most `timeout_s`; True when all finished."""
        self.is_draining = True
        self._idle = asyncio.Event()
        if self.num_in_flight == 0:
            self._idle.set()
        started, waiting = time.monotonic(), self.num_in_flight
        log.info("draining before shutdown", in_flight=waiting, timeout_s=self.timeout_s)
        try:
            await asyncio.wait_for(self._idle.wait(), self.timeout_s)
        except TimeoutError:
            log.warning("drain deadline reached: cutting the requests still open", in_flight=self.num_in_flight)
            return False
        log.info("drained", requests=waiting, seconds=round(time.monotonic() - started, 3))
        return True


class DrainGate:
    """Middleware: counts HTTP requests in flight (a stream until its last byte) and, while the
    gateway drains, answers new ones 503."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.is_draining and scope["path"] != "/metrics":
            error = ServiceUnavailable(
                "the gateway is shutting down; retry (another replica will answer)", retry_after_s=DRAIN_RETRY_AFTER_S
            )
            response = error_response(error, openai="/ai/v1/" in scope["path"])
            response.headers["connection"] = "close"
            await response(scope, receive, send)
            return

        async def send_closing(message: Message) -> None:  # kept-alive connections end with this answer
            if self.drain.is_draining and message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"connection", b"close")]
            await send(message)

        self.drain.enter()
        try:
            await self.app(scope, receive, send_closing)
        finally:
            self.drain.leave()
