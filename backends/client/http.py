"""The HTTP transport of the backend hop: a pool of keep-alive HTTP/1.1 connections behind a small interface.

Every request the backend client sends goes through `HTTPTransport.request`, which returns as
soon as the response head has arrived; the body is then read with `Response.iter_bytes` or
`Response.read`. A response read to its end gives its connection back to the pool; one closed
before its end drops its connection at once, so the backend sees the disconnect and aborts.

Why our own client: the backend hop is a few requests to a few peers we know, always one whole
request out and one answer back, so a connection is an asyncio protocol with httptools' parser
(backends/client/http_connection.py) and the pool a list per peer. httpx's pool re-polled every
idle connection on each request (~2.4 ms of CPU per streamed completion on 2 shared cores);
aiohttp, which came next, cost about twice what this does for a streamed completion (its
request and response objects, header multidicts, timers and stream readers; BENCHMARKS.md,
"Gateway CPU per streamed request").

Errors are `TransportTimeout` (connecting, waiting for a free connection, for the head or for
the next body bytes took too long) and `TransportError` (refused, reset, closed early, an
unparsable answer). They never leave the backend client: it converts them at its seam.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections import deque
from collections.abc import AsyncGenerator, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from backends.client.http_connection import Connection, TransportError, TransportTimeout

__all__ = ["HTTPTransport", "Response", "TransportError", "TransportTimeout"]

LATE_TIMER_S = 0.05  # a connect timeout that fired this much late: the event loop was busy (on time: ~1 ms)
MAX_ATTEMPTS = 4  # tries of one request when a kept-alive connection was dropped or a connect timer fired late


@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL's request goes: the peer (`key`) and the request line's target."""

    is_tls: bool
    host: str
    port: int
    path: str  # path and query

    @property
    def key(self) -> tuple[bool, str, int]:
        return self.is_tls, self.host, self.port


@lru_cache(maxsize=4096)
def target_of(url: str) -> Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TransportError(f"not an http(s) URL: {url}")
    is_tls = parts.scheme == "https"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(is_tls, parts.hostname, parts.port or (443 if is_tls else 80), path)


class Headers(Mapping[str, str]):
    """A response's headers, looked up by name in any case."""

    def __init__(self, lowered: dict[str, str]) -> None:
        self._lowered = lowered

    def __getitem__(self, name: str) -> str:
        return self._lowered[name.lower()]

    def __iter__(self) -> Iterator[str]:
        return iter(self._lowered)

    def __len__(self) -> int:
        return len(self._lowered)


class Response:
    """One response: status and headers at once, the body as it arrives.

    Read the body with `iter_bytes()` or `read()`, then `close()` (idempotent, and done for you
    when the body has been read to its end): a fully read response returns its connection to the
    pool, any other drops it. Each wait for more bytes is bounded by the request's timeout.
    """

    def __init__(
        self, pool: HTTPTransport, target: Target, connection: Connection, what: str, timeout_s: float
    ) -> None:
        self._pool = pool
        self._target = target
        self._connection = connection
        self._what = what
        self._timeout_s = timeout_s
        self.status = connection.status
        self.reason = connection.reason
        self.headers: Mapping[str, str] = Headers(connection.headers)
        self.content = b""  # the body, once `read()` has returned
        self._closed = False

    async def iter_bytes(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives (what is buffered, at once); raises TransportError/TransportTimeout."""
        connection = self._connection
        while True:
            if connection.has_body():
                yield connection.take_body()
            elif connection.is_complete:
                self._release()
                return
            elif connection.error is not None:
                raise TransportError(f"{self._what}: {connection.error}")
            elif self._closed:
                raise TransportError(f"{self._what}: the response was closed")
            else:
                try:
                    await connection.wait(self._timeout_s)
                except TimeoutError:
                    raise TransportTimeout(f"{self._what}: timed out waiting for the body") from None

    def release_if_ended(self) -> bool:
        """True (and the connection back in the pool) when the whole body has arrived and been
        read already: nothing is left to drain, so no wait and no timer are needed."""
        if self._closed or not self._connection.is_complete or self._connection.has_body():
            return False
        self._release()
        return True

    async def read(self) -> bytes:
        self.content = b"".join([chunk async for chunk in self.iter_bytes()])
        return self.content

    def json(self) -> Any:
        """The body read by `read()`, decoded as JSON (raises ValueError)."""
        return json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def _release(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool._give_back(self._target, self._connection, self._connection.finish())

    def close(self) -> None:
        """Before the body's end this drops the connection: the peer sees the disconnect."""
        if not self._closed:
            self._closed = True
            self._pool._give_back(self._target, self._connection, False)


class HTTPTransport:
    """A pool of keep-alive HTTP/1.1 connections, shared by every request of one process.

    At most `max_connections` requests are in progress at once (more wait, within their
    timeout; 0: no limit, for a caller that caps requests itself); connecting is bounded by
    `connect_timeout_s`; idle connections are closed after `keepalive_expiry_s`, before a server
    drops them (uvicorn does after 5 s). `headers` go with every request (the backend client's
    `Authorization`).
    """

    def __init__(
        self,
        *,
        connect_timeout_s: float = 2.0,
        max_connections: int = 256,
        keepalive_expiry_s: float = 4.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        common = {"user-agent": "edgerun-gateway", **(headers or {})}
        self._head_lines = "".join(f"{name}: {value}\r\n" for name, value in common.items())
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._keepalive_expiry_s = keepalive_expiry_s
        self._idle: dict[tuple[bool, str, int], deque[Connection]] = {}  # oldest first
        self._open: set[Connection] = set()  # every connection not yet closed, idle or busy
        self._num_busy = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._tls: ssl.SSLContext | None = None
        self._is_closed = False

    async def request(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        *,
        timeout_s: float,
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        """Send a request; returns once the response head is in. `timeout_s` bounds the wait for
        a free connection, for the head and then for each piece of the body. `headers`: this
        request's own, beside the transport's."""
        if self._is_closed:
            raise TransportError("the HTTP transport is closed")
        target = target_of(url)
        what = f"{method} {url}"
        request = self._encode(method, target, body, headers)
        await self._take_slot(what, timeout_s)
        has_retried = False  # a kept-alive connection the peer had dropped is retried once, as aiohttp did
        try:
            for attempt in range(1, MAX_ATTEMPTS + 1):
                connection, is_reused = (None, False) if has_retried else self._idle_connection(target)
                if connection is None:
                    connection = await self._connect(target, what, timeout_s, attempt)
                    if connection is None:
                        continue  # the connect timer fired late: again
                connection.send(request)
                try:
                    while not connection.is_head_complete:
                        if connection.error is not None:
                            raise connection.error
                        await connection.wait(timeout_s)
                except TimeoutError:
                    self._drop(connection)
                    raise TransportTimeout(f"{what}: timed out waiting for the response head") from None
                except TransportError as exc:
                    self._drop(connection)
                    # The peer closed a kept-alive connection without answering (it dropped it as idle
                    # just as we reused it): once more, on a fresh connection.
                    if is_reused and not connection.has_answer_bytes and not has_retried:
                        has_retried = True
                        continue
                    raise TransportError(f"{what}: {exc}") from None
                except BaseException:  # cancelled: the connection is in an unknown state
                    self._drop(connection)
                    raise
                return Response(self, target, connection, what, timeout_s)
            raise TransportError(f"{what}: no connection answered in {MAX_ATTEMPTS} tries")
        except BaseException:
            self._free_slot()
            raise

    def _encode(self, method: str, target: Target, body: bytes | None, headers: Mapping[str, str] | None) -> bytes:
        port = "" if target.port == (443 if target.is_tls else 80) else f":{target.port}"
        head = f"{method} {target.path} HTTP/1.1\r\nhost: {target.host}{port}\r\n{self._head_lines}"
        if headers:
            head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        if body is None:
            return (head + "\r\n").encode("latin-1")
        head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        return head.encode("latin-1") + body

    # ---- the pool ------------------------------------------------------------------------------

    async def _take_slot(self, what: str, timeout_s: float) -> None:
        if self._max_connections and self._num_busy >= self._max_connections:
            waiter = asyncio.get_running_loop().create_future()
            self._slot_waiters.append(waiter)
            try:
                async with asyncio.timeout(timeout_s):
                    await waiter  # `_free_slot` hands its slot over: `_num_busy` stays as it is
                return
            except BaseException as exc:
                if waiter.done() and not waiter.cancelled():
                    self._free_slot()  # handed a slot just as this gave up: pass it on
                waiter.cancel()  # `_free_slot` skips it
                if isinstance(exc, TimeoutError):
                    raise TransportTimeout(f"{what}: timed out waiting for a free connection") from None
                raise
        self._num_busy += 1

    def _free_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._num_busy -= 1

    def _idle_connection(self, target: Target) -> tuple[Connection | None, bool]:
        idle = self._idle.get(target.key)
        if idle:
            now = asyncio.get_running_loop().time()
            while idle:
                connection = idle.pop()  # the most recently used
                if not self._is_stale(connection, now):
                    return connection, True
                self._drop(connection)
        return None, False

    def _is_stale(self, connection: Connection, now: float) -> bool:
        """Gone, or idle so long that the server may be closing it."""
        return connection.is_lost or connection.idle_since <= now - self._keepalive_expiry_s

    async def _connect(self, target: Target, what: str, timeout_s: float, attempt: int) -> Connection | None:
        """A new connection; None when the connect timer fired late and another try is left."""
        loop = asyncio.get_running_loop()
        limit_s = min(self._connect_timeout_s, timeout_s)
        started = loop.time()
        tls = self._tls_context() if target.is_tls else None
        try:
            async with asyncio.timeout(limit_s):
                transport, connection = await loop.create_connection(
                    lambda: Connection(loop),
                    target.host,
                    target.port,
                    ssl=tls,
                    server_hostname=target.host if tls else None,
                )
        except TimeoutError:
            # A connect timer that fired late fired because this process's event loop was busy (a
            # burst of requests), not because the peer is slow: the connection was most likely made
            # long before the loop looked. Again (a few times: a burst can last several turns of
            # the loop); a timer on time means a slow peer.
            if loop.time() - started - limit_s < LATE_TIMER_S:
                raise TransportTimeout(f"{what}: timed out connecting") from None
            if attempt == MAX_ATTEMPTS:
                raise TransportTimeout(f"{what}: connect timed out, the event loop busy", late=True) from None
            return None
        except OSError as exc:
            raise TransportError(f"cannot connect to {target.host}:{target.port}: {exc}") from None
        connection.transport = transport  # uvloop calls `connection_made` only on a later turn
        self._open.add(connection)
        return connection

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def _give_back(self, target: Target, connection: Connection, is_reusable: bool) -> None:
        """A response is done with its connection: idle in the pool if reusable, else closed."""
        self._free_slot()
        if not is_reusable or self._is_closed:
            self._drop(connection)
            return
        now = asyncio.get_running_loop().time()
        connection.idle_since = now
        idle = self._idle.setdefault(target.key, deque())
        while idle and self._is_stale(idle[0], now):
            self._drop(idle.popleft())  # expired: close it before the server does
        idle.append(connection)

    def _drop(self, connection: Connection) -> None:
        connection.abort()
        self._open.discard(connection)

    async def aclose(self) -> None:
        self._is_closed = True
        for connection in list(self._open):
            self._drop(connection)
        self._idle.clear()
        await asyncio.sleep(0)  # the transports finish closing
