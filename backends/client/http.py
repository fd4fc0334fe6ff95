"""A lean HTTP/1.1 client for the backend hop: a keep-alive connection pool and streamed bodies.

Every request the backend client sends goes through `HTTPTransport.request`, which returns as
soon as the response head has arrived; the body is then read with `Response.iter_bytes` or
`Response.read`. Only what backends need is spoken: HTTP/1.1 over TCP or TLS, one request at a
time per connection, sized or chunked bodies; no redirects, cookies, proxies or HTTP/2. The
response is parsed by httptools (the C parser uvicorn uses).

Why not httpx: with tens of concurrent streams its pool rescans every connection on every
request (polling each idle socket for readability), and its layers wrap every body read; on a
2-core machine it cost more CPU per streamed completion than the rest of the gateway together
(BENCHMARKS.md, gateway overhead).

A connection goes back to the pool only when its response was read to the end and both sides
keep it alive. A response closed before its end drops its connection at once, so the backend
sees the disconnect and aborts. Idle connections older than `keepalive_expiry_s` are closed
rather than reused (servers close idle ones after about 5 s: uvicorn's default), and a request
whose reused connection turns out closed by the peer before any answer is sent once more on a
fresh connection.

Errors are `TransportTimeout` (connecting, or waiting for the head or the next body bytes, took
too long) and `TransportError` (refused, reset, closed early, unparsable answer). They never
leave the backend client: it converts them at its seam.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

# Flow control: stop reading from the socket while this much body is waiting for the consumer.
PAUSE_READING_BYTES = 256 * 1024
RESUME_READING_BYTES = 64 * 1024


class TransportError(Exception):
    """The connection or the peer failed: refused, reset, closed early, or an unparsable answer."""


class TransportTimeout(TransportError):
    """Connecting, or waiting for the response head or the next body bytes, took too long."""


class _ClosedBeforeAnswer(TransportError):
    """The peer closed the connection before sending a byte of the answer (a reused connection
    that the peer had just dropped as idle is retried once on a fresh one)."""


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int
    netloc: str  # the Host header


@lru_cache(maxsize=1024)
def split_url(url: str) -> tuple[Origin, str]:
    """(origin, request target) of an absolute http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TransportError(f"cannot send to {url!r}: only http:// and https:// URLs are supported")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Origin(parts.scheme, parts.hostname, port, parts.netloc.rpartition("@")[2]), target


def encode_request(method: str, target: str, host: str, body: bytes | None) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", f"host: {host}", "accept: */*", "user-agent: edgerun-gateway"]
    if body is not None:
        lines += ["content-type: application/json", f"content-length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


class Response:
    """One response: status and headers at once, the body as it arrives.

    Read the body with `iter_bytes()` or `read()`, then `close()` (idempotent, and done for you
    when the body has been read to its end): a fully read response returns its connection to
    the pool, any other drops it. Each wait for more bytes is bounded by the request's timeout.
    """

    def __init__(self, connection: _Connection, timeout_s: float) -> None:
        self._connection = connection
        self._timeout_s = timeout_s
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.content = b""  # the body, once `read()` has returned
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._started = False  # any byte of the answer arrived
        self._has_head = False
        self._complete = False
        self._keep_alive = False
        self._error: TransportError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    # -- what the connection feeds in -------------------------------------------------------

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _on_body(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > PAUSE_READING_BYTES:
            self._connection.pause_reading()
        self._wake()

    def _fail(self, error: TransportError) -> None:
        if not self._complete and self._error is None:
            self._error = error
            self._wake()

    # -- what the caller reads --------------------------------------------------------------

    async def _wait(self) -> None:
        if self._error is not None:
            raise self._error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._waiter
        except TimeoutError as exc:
            raise TransportTimeout(f"no data from the peer for {self._timeout_s}s") from exc
        finally:
            self._waiter = None

    async def _wait_head(self) -> None:
        while not self._has_head:
            await self._wait()

    async def iter_bytes(self) -> AsyncIterator[bytes]:
        """The body in the pieces it arrives in; raises TransportError/TransportTimeout."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._buffered < RESUME_READING_BYTES:
                    self._connection.resume_reading()
                yield chunk
            elif self._complete:
                self.close()
                return
            else:
                await self._wait()

    async def read(self) -> bytes:
        self.content = b"".join([chunk async for chunk in self.iter_bytes()])
        return self.content

    def json(self) -> Any:
        """The body read by `read()`, decoded as JSON (raises ValueError)."""
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._connection.finished(reusable=self._complete and self._keep_alive and self._error is None)


class _Connection(asyncio.Protocol):
    """One TCP (or TLS) connection: feeds the bytes it receives to the current `Response`."""

    def __init__(self, origin: Origin, on_finished: Callable[[_Connection, bool], None]) -> None:
        self.origin = origin
        self.idle_since = 0.0
        self.is_closed = False
        self._on_finished = on_finished
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._response: Response | None = None  # the response of the request in progress
        self._reading: Response | None = None  # the same, until its message has fully arrived
        self._is_paused = False

    # -- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        response = self._response
        if response is None:  # bytes while idle: the peer does not speak HTTP/1.1 as we do
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            response._fail(TransportError(f"malformed HTTP response from {self.origin.netloc}: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.is_closed = True
        response = self._response
        if response is None or response._complete:
            return
        if response._has_head and not self._has_framing(response):  # a body delimited by the close
            response._complete = True
            response._wake()
            return
        error = _ClosedBeforeAnswer if not response._started else TransportError
        reason = f": {exc}" if exc else ""
        response._fail(error(f"{self.origin.netloc} closed the connection before the answer ended{reason}"))

    # -- httptools callbacks: they fill in `_reading`, the response whose message is arriving --

    def on_message_begin(self) -> None:
        if self._reading is None:  # a second answer to one request: never trust this connection again
            self.close()
            return
        self._reading._started = True

    def on_status(self, status: bytes) -> None:
        if self._reading is not None:
            self._reading.reason += status.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._reading is None:
            return
        headers = self._reading.headers
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        response = self._reading
        if response is None:
            return
        response.status = self._parser.get_status_code()
        response._keep_alive = self._parser.should_keep_alive()
        response._has_head = True
        response._wake()

    def on_body(self, body: bytes) -> None:
        if self._reading is not None:
            self._reading._on_body(body)

    def on_message_complete(self) -> None:
        response, self._reading = self._reading, None
        if response is not None:
            response._complete = True
            response._wake()

    # -- used by the transport and the response ---------------------------------------------

    @staticmethod
    def _has_framing(response: Response) -> bool:
        return "content-length" in response.headers or "chunked" in response.headers.get("transfer-encoding", "")

    async def send(self, request: bytes, timeout_s: float) -> Response:
        """Write one request and wait for its response head."""
        assert self._transport is not None and self._response is None
        response = self._response = self._reading = Response(self, timeout_s)
        self._transport.write(request)
        await response._wait_head()
        return response

    def finished(self, *, reusable: bool) -> None:
        self._response = self._reading = None
        self.resume_reading()
        if not reusable:
            self.close()
        self._on_finished(self, reusable and not self.is_closed)

    def pause_reading(self) -> None:
        if not self._is_paused and self._transport is not None:
            self._is_paused = True
            self._transport.pause_reading()

    def resume_reading(self) -> None:
        if self._is_paused and self._transport is not None and not self.is_closed:
            self._is_paused = False
            self._transport.resume_reading()

    def close(self) -> None:
        self.is_closed = True
        if self._transport is not None:
            self._transport.close()


class HTTPTransport:
    """A pool of keep-alive HTTP/1.1 connections, shared by every request of one process.

    At most `max_connections` requests are in progress at once (more wait, within their
    timeout); connecting is bounded by `connect_timeout_s`.
    """

    def __init__(
        self, *, connect_timeout_s: float = 2.0, max_connections: int = 256, keepalive_expiry_s: float = 4.0
    ) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._keepalive_expiry_s = keepalive_expiry_s
        self._max_idle = max_connections
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: dict[Origin, list[_Connection]] = {}
        self._active: set[_Connection] = set()
        self._ssl: ssl.SSLContext | None = None
        self._is_closed = False

    async def request(self, method: str, url: str, body: bytes | None = None, *, timeout_s: float) -> Response:
        """Send a request; returns once the response head is in. `timeout_s` bounds the wait for
        a free slot, for the head and then for each piece of the body."""
        if self._is_closed:
            raise TransportError("the HTTP transport is closed")
        origin, target = split_url(url)
        request = encode_request(method, target, origin.netloc, body)
        if self._slots.locked():
            try:
                async with asyncio.timeout(timeout_s):
                    await self._slots.acquire()
            except TimeoutError as exc:
                raise TransportTimeout(f"no free connection slot within {timeout_s}s") from exc
        else:
            await self._slots.acquire()  # returns at once
        try:
            connection = self._take_idle(origin)
            if connection is not None:
                try:
                    return await self._send(connection, request, timeout_s)
                except _ClosedBeforeAnswer:
                    pass  # the peer dropped it as idle just now: once more on a fresh connection
            return await self._send(await self._connect(origin), request, timeout_s)
        except BaseException:
            self._slots.release()
            raise

    async def aclose(self) -> None:
        self._is_closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()
        for connection in list(self._active):
            connection.close()

    async def _send(self, connection: _Connection, request: bytes, timeout_s: float) -> Response:
        self._active.add(connection)
        try:
            return await connection.send(request, timeout_s)
        except BaseException:
            self._active.discard(connection)
            connection.close()
            raise

    def _take_idle(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()  # the most recently used: the least likely to have expired
            if not connection.is_closed and now - connection.idle_since < self._keepalive_expiry_s:
                return connection
            connection.close()
        return None

    def _finished(self, connection: _Connection, reusable: bool) -> None:
        """A response is done with `connection`: keep it for the next request, or let it go."""
        self._active.discard(connection)
        self._slots.release()
        if not reusable or self._is_closed:
            connection.close()
            return
        idle = self._idle.setdefault(connection.origin, [])
        if len(idle) >= self._max_idle:
            idle.pop(0).close()  # the oldest
        connection.idle_since = time.monotonic()
        idle.append(connection)

    async def _connect(self, origin: Origin) -> _Connection:
        loop = asyncio.get_running_loop()
        context = self._ssl_context() if origin.scheme == "https" else None
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: _Connection(origin, self._finished),
                    origin.host,
                    origin.port,
                    ssl=context,
                    server_hostname=origin.host if context is not None else None,
                )
        except TimeoutError as exc:
            raise TransportTimeout(f"connecting to {origin.netloc} took over {self._connect_timeout_s}s") from exc
        except OSError as exc:  # refused, unreachable, name not found, TLS failures (ssl.SSLError)
            raise TransportError(f"cannot connect to {origin.netloc}: {exc}") from exc
        return connection

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl
