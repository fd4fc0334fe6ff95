"""The HTTP transport of the backend hop: aiohttp's keep-alive client behind a small interface.

Every request the backend client sends goes through `HTTPTransport.request`, which returns as
soon as the response head has arrived; the body is then read with `Response.iter_bytes` or
`Response.read`. A response read to its end gives its connection back to the pool; one closed
before its end drops its connection at once, so the backend sees the disconnect and aborts.

Why aiohttp and not httpx (the project's client elsewhere: admin CLI, tests): with tens of
concurrent streams, httpx's pool re-polls every idle connection on each request and its layers
wrap every body read; on a 2-core machine that cost ~2.4 ms of CPU per streamed completion, more
than the rest of the gateway together, against ~0.25 ms for aiohttp (BENCHMARKS.md, gateway
overhead). Nothing outside this module sees aiohttp.

Errors are `TransportTimeout` (connecting, waiting for a free connection, for the head or for
the next body bytes took too long) and `TransportError` (refused, reset, closed early, an
unparsable answer). They never leave the backend client: it converts them at its seam.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp

LATE_TIMER_S = 0.05  # a connect timeout that fired this much late: the event loop was busy (on time: ~1 ms)
MAX_ATTEMPTS = 4  # tries of one request when a kept-alive connection was dropped or a connect timer fired late


class TransportError(Exception):
    """The connection or the peer failed: refused, reset, closed early, or an unparsable answer."""


class TransportTimeout(TransportError):
    """Connecting, or waiting for a free connection, the response head or the next body bytes,
    took too long. `late`: a connect timer that fired late every time (this process's event loop
    was busy: weak evidence against the peer)."""

    def __init__(self, message: str, *, late: bool = False) -> None:
        super().__init__(message)
        self.late = late


def _converted(exc: BaseException, what: str) -> TransportError:
    if isinstance(exc, TimeoutError):  # aiohttp's timeouts are TimeoutErrors too
        return TransportTimeout(f"{what}: timed out ({exc or type(exc).__name__})")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return TransportError(f"cannot connect to {exc.host}:{exc.port}: {exc.os_error}")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return TransportError(f"{what}: the peer closed the connection before the answer ended ({exc})")
    if isinstance(exc, aiohttp.ClientResponseError):  # aiohttp raises it for an unparsable answer
        return TransportError(f"{what}: malformed HTTP response ({exc.message})")
    return TransportError(f"{what}: {exc or type(exc).__name__}")


class Response:
    """One response: status and headers at once, the body as it arrives.

    Read the body with `iter_bytes()` or `read()`, then `close()` (idempotent, and done for you
    when the body has been read to its end): a fully read response returns its connection to the
    pool, any other drops it. Each wait for more bytes is bounded by the request's timeout.
    """

    def __init__(self, response: aiohttp.ClientResponse, what: str) -> None:
        self._response = response
        self._what = what
        self.status = response.status
        self.reason = response.reason or ""
        self.headers: Mapping[str, str] = response.headers  # case-insensitive
        self.content = b""  # the body, once `read()` has returned
        self._complete = False
        self._closed = False

    async def iter_bytes(self) -> AsyncGenerator[bytes, None]:
        """The body in the pieces it arrives in; raises TransportError/TransportTimeout."""
        stream = self._response.content
        while True:
            try:
                chunk = await stream.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _converted(exc, self._what) from exc
            if not chunk:
                self._complete = True
                self.close()
                return
            yield chunk

    def release_if_ended(self) -> bool:
        """True (and the connection back in the pool) when the whole body has arrived and been
        read already: nothing is left to drain, so no wait and no timer are needed."""
        if self._closed or not self._response.content.at_eof():
            return False
        self._complete = True
        self.close()
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

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._complete:
            self._response.release()  # back to the pool (aiohttp keeps it only if both sides allow)
        else:
            self._response.close()  # drops the connection: the peer sees the disconnect


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
        self._headers = {"user-agent": "edgerun-gateway", **(headers or {})}
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._keepalive_expiry_s = keepalive_expiry_s
        self._session: aiohttp.ClientSession | None = None  # made in the running event loop
        self._is_closed = False

    def _open_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=0, keepalive_timeout=self._keepalive_expiry_s
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=True,
                skip_auto_headers=("User-Agent",),
                headers=self._headers,
            )
        return self._session

    async def request(
        self, method: str, url: str, body: bytes | None = None, *, timeout_s: float, headers: Mapping[str, str] | None = None
    ) -> Response:
        """Send a request; returns once the response head is in. `timeout_s` bounds the wait for
        a free connection, for the head and then for each piece of the body. `headers`: this
        request's own, beside the transport's."""
        if self._is_closed:
            raise TransportError("the HTTP transport is closed")
        session = self._open_session()
        sent = {**({"content-type": "application/json"} if body is not None else {}), **(headers or {})}
        # connect: a free connection from the pool (or a new one); sock_read: each wait for bytes
        timeout = aiohttp.ClientTimeout(
            total=None, connect=timeout_s, sock_connect=self._connect_timeout_s, sock_read=timeout_s
        )
        what = f"{method} {url}"
        loop = asyncio.get_running_loop()
        for attempt in range(1, MAX_ATTEMPTS + 1):
            started = loop.time()
            try:
                response = await session.request(method, url, data=body, headers=sent or None, timeout=timeout)
                return Response(response, what)
            except aiohttp.ServerDisconnectedError as exc:
                # The peer closed a kept-alive connection without answering (it dropped it as idle
                # just as we reused it): once more, on a fresh connection.
                if attempt > 1:
                    raise _converted(exc, what) from exc
            except aiohttp.ConnectionTimeoutError as exc:
                # A connect timer that fired late fired because this process's event loop was busy
                # (a burst of requests), not because the peer is slow: the connection was most likely
                # made long before the loop looked. Again (a few times: a burst can last several
                # turns of the loop); a timer on time means a slow peer.
                late_s = loop.time() - started - min(self._connect_timeout_s, timeout_s)
                if late_s < LATE_TIMER_S:
                    raise _converted(exc, what) from exc
                if attempt == MAX_ATTEMPTS:
                    raise TransportTimeout(f"{what}: connect timed out, the event loop busy", late=True) from exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _converted(exc, what) from exc
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self._is_closed = True
        if self._session is not None:
            await self._session.close()
