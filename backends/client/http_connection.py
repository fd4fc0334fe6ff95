"""One keep-alive HTTP/1.1 connection of the backend hop: an asyncio protocol parsing with httptools.

The connection writes a request whole (head and body in one write) and parses the answer as it
arrives (httptools' `HttpResponseParser`, the C parser uvicorn serves with): the head's status
and headers, then the body's pieces into a buffer the reader takes all at once. A reader waits
(`wait`) only when nothing is buffered; each wait is bounded by the request's timeout. A stream
waits once per token, so the waits share one timer, set again only when it fires before the
deadline of the wait then open (a timer made and cancelled per wait cost ~1.6 us each on uvloop:
~0.1 ms of the ~3.8 ms a 64-token stream costs the gateway). Reading pauses while more than
`HIGH_WATER` bytes sit unread, so a slow reader holds a backend's fast stream back instead of
buffering it whole.

A body ends at its length, at its last chunk, or with the connection when the answer gives
neither (close-delimited). Failures are `TransportError`s kept in `error` for the reader: an
unparsable answer, or the peer closing before the answer ended.
"""

from __future__ import annotations

import asyncio
from typing import cast

import httptools

HIGH_WATER = 256 * 1024  # unread body bytes at which reading pauses
TIMER_SLACK_S = 0.001  # the shortest delay the wait timer is set again for (uvloop rounds shorter ones to none)


class TransportError(Exception):
    """The connection or the peer failed: refused, reset, closed early, or an unparsable answer."""


class TransportTimeout(TransportError):
    """Connecting, or waiting for a free connection, the response head or the next body bytes,
    took too long. `late`: a connect timer that fired late every time (this process's event loop
    was busy: weak evidence against the peer)."""

    def __init__(self, message: str, *, late: bool = False) -> None:
        super().__init__(message)
        self.late = late


class Connection(asyncio.Protocol):
    """One connection to one peer; one request at a time (`send`), its answer read through
    `status`, `headers`, `take_body`, `wait` and the `is_*` flags."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.is_lost = False  # the connection is gone (either side closed it)
        self.idle_since = 0.0  # loop time it went back to the pool
        self._waiter: asyncio.Future[None] | None = None
        self._wait_deadline = 0.0  # loop time at which the open wait times out
        self._timer: asyncio.TimerHandle | None = None  # fires at or before _wait_deadline
        self._reset()

    def _reset(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.is_in_request = False
        self.has_answer_bytes = False  # any byte of the answer arrived (a reused connection dropped before: retry)
        self.is_head_complete = False
        self.is_complete = False  # the whole answer has been parsed (its body may be unread still)
        self.error: TransportError | None = None
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}  # lower-case names
        self._body: list[bytes] = []
        self._num_buffered = 0
        self._is_close_delimited = False
        self._is_keep_alive = False
        self._is_paused = False

    # ---- the reader's side ---------------------------------------------------------------------

    def send(self, request: bytes) -> None:
        """Write one whole request; the answer's state starts afresh."""
        assert self.transport is not None and not self.is_in_request
        self._reset()
        self.is_in_request = True
        self.transport.write(request)

    def has_body(self) -> bool:
        return bool(self._body)

    def take_body(self) -> bytes:
        """Every body byte buffered so far (reading resumes if it was paused)."""
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body, self._num_buffered = [], 0
        if self._is_paused and self.transport is not None and not self.is_lost:
            self._is_paused = False
            self.transport.resume_reading()
        return body

    async def wait(self, timeout_s: float) -> None:
        """Until something new arrives (head, body bytes, the end, an error); TimeoutError past `timeout_s`."""
        waiter = self._loop.create_future()
        self._waiter = waiter
        self._wait_deadline = self._loop.time() + timeout_s
        if self._timer is None or self._timer.when() > self._wait_deadline:  # else it fires early, and is set again
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(self._wait_deadline, self._on_timer)
        try:
            await waiter
        finally:
            self._waiter = None

    def _on_timer(self) -> None:
        """The open wait times out if its deadline has come; else the timer is set for it (no wait open:
        none, the next wait sets one)."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        now = self._loop.time()
        if now >= self._wait_deadline:
            waiter.set_exception(TimeoutError())
        else:
            self._timer = self._loop.call_at(max(self._wait_deadline, now + TIMER_SLACK_S), self._on_timer)

    def finish(self) -> bool:
        """The answer was read to its end: True when the connection may carry another request."""
        self.is_in_request = False
        return self._is_keep_alive and not self.is_lost

    def abort(self) -> None:
        self.is_lost = True
        if self.transport is not None:
            self.transport.abort()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # ---- asyncio's side ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not registered as one

    def data_received(self, data: bytes) -> None:
        if not self.is_in_request or self.is_complete:  # bytes nobody asked for: never reuse this one
            self.abort()
            return
        self.has_answer_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = TransportError(f"malformed HTTP response ({exc})")
            self.abort()
        if self._num_buffered > HIGH_WATER and not self._is_paused and not self.is_lost:
            self._is_paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_lost = True
        if self._timer is not None:  # (a wait still open is woken below)
            self._timer.cancel()
            self._timer = None
        if self.is_in_request and not self.is_complete and self.error is None:
            if self.is_head_complete and self._is_close_delimited and exc is None:
                self.is_complete = True  # such a body ends with the connection
            else:
                reason = f" ({exc})" if exc is not None else ""
                self.error = TransportError(f"the peer closed the connection before the answer ended{reason}")
        self._wake()

    # ---- httptools' callbacks ------------------------------------------------------------------

    def on_status(self, reason: bytes) -> None:
        self.reason = reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.is_head_complete = True
        has_length = "content-length" in self.headers or "chunked" in self.headers.get("transfer-encoding", "")
        self._is_close_delimited = not has_length and self.status >= 200 and self.status not in (204, 304)

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        self._num_buffered += len(body)

    def on_message_complete(self) -> None:
        self.is_complete = True
        self._is_keep_alive = self._parser.should_keep_alive()  # the parser forgets it once the next answer may begin
