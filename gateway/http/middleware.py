"""The gateway's one middleware: request id, access log, request metrics, last-resort errors.

Pure ASGI (no BaseHTTPMiddleware: it would buffer streams and cost a task per request). For each
HTTP request it
- gives the request a fresh id (`scope["state"]["request_id"]`, the ledger's key, so a client
  can never make two requests share one) and returns it as the `cf-ray` header, as Cloudflare
  does; a client's own `x-request-id` (when a sane token: 1-128 of [A-Za-z0-9._:-]) is kept as
  `scope["state"]["client_request_id"]` and echoed back, else `x-request-id` is ours too; both
  ids are bound to the structlog context; a worker of `edgerun serve --workers` also names itself
  (`x-edgerun-worker: <index>`);
- when the last body byte is sent, counts the request and its latency by route template, status
  and model (handlers put the model id in `scope["state"]["model"]`) and logs one access line;
- turns an exception that escaped every handler into a 500 envelope (with the request id) when
  no response has started, and logs it with its traceback; a client that left while its body was
  being read (`ClientDisconnect`) is no error: it is logged at INFO as status 499.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

import structlog
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import contracts.request_id as request_id_contract
from gateway.errors import InternalError
from gateway.http.envelopes import error_response
from gateway.metrics import GatewayMetrics

REQUEST_ID_HEADER = request_id_contract.REQUEST_ID_HEADER.encode()
RAY_HEADER = b"cf-ray"
WORKER_HEADER = b"x-edgerun-worker"
_REQUEST_ID_RE = re.compile(request_id_contract.PATTERN.encode())
log = structlog.get_logger("edgerun.gateway")


def incoming_request_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == REQUEST_ID_HEADER and _REQUEST_ID_RE.match(value):
            return bytes(value).decode()
    return None


def new_request_id() -> str:
    """A version-7 UUID (RFC 9562) as 32 hex digits, made now (`uuid7_hex`). The ledger is keyed by
    request id: time-ordered ids are appended at the end of its key's index, where random
    (version-4) ones each landed on a page of their own, a cache miss once the ledger is large (a
    one-record commit: 45.9 -> 34.0 us of CPU with a million records, BENCHMARKS.md "Ledger and
    metering")."""
    return uuid7_hex(time.time_ns() // 1_000_000)


def uuid7_hex(unix_ms: int) -> str:
    """A version-7 UUID as 32 hex digits: `unix_ms`, then 74 random bits. Built without a `UUID`
    object (a measurable part of the gateway's CPU per request)."""
    n = unix_ms << 80 | int.from_bytes(os.urandom(10), "big")
    n = (n & ~(0xF000 << 64)) | (7 << 76)  # version 7
    n = (n & ~(0xC000 << 48)) | (0x8000 << 48)  # RFC 9562 variant
    return f"{n:032x}"


def is_openai_path(path: str) -> bool:
    return "/ai/v1/" in path


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, worker: int | None = None) -> None:
        self.app = app
        self.metrics = metrics
        # one of several worker processes (`edgerun serve --workers`): each answer names it
        self.worker_header = [(WORKER_HEADER, str(worker).encode())] if worker is not None else []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id = new_request_id()
        client_request_id = incoming_request_id(scope)
        state: dict[str, Any] = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["client_request_id"] = client_request_id
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id, client_request_id=client_request_id)
        id_headers = [
            (RAY_HEADER, request_id.encode()),
            (REQUEST_ID_HEADER, (client_request_id or request_id).encode()),
            *self.worker_header,
        ]
        status = 500
        started = finished = False

        async def send_with_context(message: Message) -> None:
            nonlocal status, started, finished
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                message["headers"] = [*message.get("headers", []), *id_headers]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        try:
            await self.app(scope, receive, send_with_context)
        except ClientDisconnect:
            pass  # nothing to answer; _observe logs it as 499 (not finished)
        except Exception:
            log.exception("unhandled error", path=scope["path"])
            if not started:
                error = InternalError(f"internal error; quote request id {request_id} when reporting it")
                await error_response(error, openai=is_openai_path(scope["path"]))(scope, receive, send_with_context)
        finally:
            self._observe(scope, state, status, time.perf_counter() - start, finished)

    def _observe(self, scope: Scope, state: dict[str, Any], status: int, elapsed: float, finished: bool) -> None:
        route = scope.get("route")
        template = getattr(route, "path", "unmatched")
        model = state.get("model", "")
        if not finished:
            status = 499  # the client went away before the last byte
        self.metrics.requests.labels(template, str(status), model).inc()
        self.metrics.latency.labels(template, model).observe(elapsed)
        log.info(
            "request",
            method=scope["method"],
            path=scope["path"],
            status=status,
            duration_ms=round(elapsed * 1000, 2),
            model=model or None,
            tenant=state.get("tenant"),
            backend=state.get("backend"),
        )
