"""Limits on what one HTTP connection may cost a listener, enforced where bytes arrive.

uvicorn's httptools protocol buffers a request's line and headers without bound and waits for
them without a deadline; a 64 MB header was answered 200, and half-sent requests stayed open
indefinitely. `limited_protocol(limits, counter)` returns a subclass of it that

- answers 414 when the request line (the URL) passes `max_request_line_bytes`;
- answers 431 when the header section passes `max_header_bytes` (counted on the raw bytes as
  they arrive, so at most one read past the bound is ever buffered) or `max_headers` fields;
- answers 408 when a connection has not finished its headers `headers_timeout_s` after it
  opened, or after its previous response (a connection that sends nothing is closed too);
- answers 408 when the request body is not complete `body_timeout_s` after its headers (the
  handler, waiting for the body, sees the client as gone);
- answers 503 to a connection over `max_connections_per_client` from one address or
  `max_connections` in all, and closes it at once; refusals at `max_connections` are logged
  (rate-limited: `gateway.http.descriptors.RefusalLog`), since that cap is fitted under the
  process's open-file limit and reaching it means the listener is full.

Each connection's writes go through `gateway.http.coalesced_writes` (what one turn of the event
loop writes, one write). The idle keep-alive limit is uvicorn's own `timeout_keep_alive`, set from the same settings by
`gateway.http.listeners`. Each listener gets its own `ConnectionCounter`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.http.coalesced_writes import CoalescedWrites
from gateway.http.descriptors import RefusalLog


class ListenerLimits(BaseModel):
    """The gateway's `[listener_limits]` settings section (each field also by its own name, e.g.
    `EDGERUN_MAX_HEADER_BYTES`, as gateway/settings.py explains)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_request_line_bytes: int = Field(default=8192, ge=256)
    max_header_bytes: int = Field(default=32_768, ge=1024)
    max_headers: int = Field(default=100, ge=8)
    headers_timeout_s: float = Field(default=10.0, gt=0)  # from connect (or the last response) to the headers' end
    body_timeout_s: float = Field(default=60.0, gt=0)  # from the headers' end to the body's end
    keep_alive_s: float = Field(default=5.0, gt=0)  # an idle kept-alive connection is closed after this
    max_connections_per_client: int = Field(default=64, ge=1)  # per client address, per listener
    # per listener; lowered at start to fit the open-file limit (gateway/http/descriptors.py)
    max_connections: int = Field(default=10_000, ge=1)


@dataclass(slots=True)
class ConnectionCounter:
    """Open connections of one listener, in all and per client address."""

    total: int = 0
    per_client: Counter[str] = field(default_factory=Counter)
    refusals: RefusalLog = field(default_factory=lambda: RefusalLog("public"))

    def admit(self, client: str, limits: ListenerLimits) -> bool:
        if self.total >= limits.max_connections or self.per_client[client] >= limits.max_connections_per_client:
            return False
        self.total += 1
        self.per_client[client] += 1
        return True

    def release(self, client: str) -> None:
        self.total -= 1
        self.per_client[client] -= 1
        if self.per_client[client] <= 0:
            del self.per_client[client]


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing; `data_received` answers `status`."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    limits: ListenerLimits = ListenerLimits()
    counter: ConnectionCounter = ConnectionCounter()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client_host: str | None = None  # set once this connection is counted
        self._reading_head = True
        self._head_bytes = 0  # raw bytes received since the request began, until its headers end
        self._header_bytes = 0
        self._header_count = 0
        self._refusal: _Refused | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._deadline_kind: str | None = None  # "head", "body" or "idle"

    # --- connection ---

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # what one turn writes goes out as one write (a streamed answer's head and first events)
        super().connection_made(cast(asyncio.Transport, CoalescedWrites(transport, self.loop)))
        host = self.client[0] if self.client else ""
        if not self.counter.admit(host, self.limits):
            if self.counter.total >= self.limits.max_connections:
                self.counter.refusals.refused(self.limits.max_connections)
            else:
                self.logger.debug("connection refused: too many open connections from %s", host)
            self._answer(503, "too many open connections; retry later")
            return
        self._client_host = host
        self._arm("head", self.limits.headers_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._client_host is not None:
            self.counter.release(self._client_host)
            self._client_host = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        if self._reading_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._reading_head and self._head_bytes > self.limits.max_header_bytes and not self.transport.is_closing():
            self._answer(431, "the request headers are too large")

    def send_400_response(self, msg: str) -> None:
        """A callback's exception stops httptools with a parser error: answer the refusal instead."""
        if self._refusal is not None:
            self._answer(self._refusal.status, self._refusal.reason)
        else:
            super().send_400_response(msg)

    # --- parser callbacks ---

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_head = True
        self._header_bytes = self._header_count = 0
        if self._deadline_kind != "head":  # the next request on a kept-alive connection
            self._arm("head", self.limits.headers_timeout_s)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.limits.max_request_line_bytes:
            self._refuse(414, "the request URI is too long")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        self._header_bytes += len(name) + len(value) + 4
        if self._header_count > self.limits.max_headers:
            self._refuse(431, "the request has too many header fields")
        if self._header_bytes > self.limits.max_header_bytes:
            self._refuse(431, "the request headers are too large")
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._head_bytes = 0
        self._arm("body", self.limits.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self._deadline_kind == "body":
            self._disarm()
        super().on_message_complete()
        answered_early = self.cycle is not None and self.cycle.response_complete
        if answered_early and self._deadline_kind is None and not self.transport.is_closing():
            self._arm("idle", self.limits.keep_alive_s)  # the rest of an early-answered body is in

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()  # ours instead: one deadline per connection at a time
        # Answered before the whole body came (429, 413): the rest is read and dropped until it ends or
        # the body deadline passes (a lingering close, so the client reads the answer, not a reset).
        if not pipelined and self._deadline_kind is None:
            self._arm("idle", self.limits.keep_alive_s)

    # --- helpers ---

    def _refuse(self, status: int, reason: str) -> None:
        self._refusal = _Refused(status, reason)
        raise self._refusal

    def _arm(self, kind: str, delay_s: float) -> None:
        self._disarm()
        self._deadline_kind = kind
        self._deadline = self.loop.call_later(delay_s, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self._deadline_kind = None

    def _expire(self) -> None:
        kind = self._deadline_kind
        self._deadline = self._deadline_kind = None
        if self.transport.is_closing():
            return
        if kind == "head":
            self._answer(408, "the request headers did not arrive in time")
        elif kind == "body" and self.cycle is not None and self.cycle.response_complete:
            self.transport.close()  # the answer went out already; stop draining the body
        elif kind == "body":
            self._answer(408, "the request body did not arrive in time")
        else:  # idle keep-alive
            self.transport.close()

    def _answer(self, status: int, reason: str) -> None:
        """Write a short plain-text error and close; a handler still waiting for the body sees the
        client as gone. After a response has started there is no room for a status: just close."""
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                self.transport.close()
                return
        body = reason.encode()
        head = STATUS_LINE[status] + b"content-type: text/plain; charset=utf-8\r\n"
        head += b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        self.transport.write(head + body)
        self.transport.close()


def limited_protocol(limits: ListenerLimits, listener: str = "public") -> type[HttpToolsProtocol]:
    """A protocol class for `uvicorn.Config(http=...)` bound to these limits and a counter of its own
    for `listener` (its name in the log)."""
    counter = ConnectionCounter(refusals=RefusalLog(listener))
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits, "counter": counter})

