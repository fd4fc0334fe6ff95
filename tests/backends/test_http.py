"""The backend hop's HTTP transport (our keep-alive pool on asyncio protocols) against raw loopback peers that
misbehave in precise ways: the contract the backend client relies on."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop

from backends.client.http import HTTPTransport, TransportError, TransportTimeout

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Peer:
    """A loopback TCP server running `handler` per connection; counts the connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.accepted = 0
        self.closed = 0  # connections whose handler is over (the client went away, or it was done)
        self.url = ""
        self.writers: set[asyncio.StreamWriter] = set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.writers.add(writer)
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            self.writers.discard(writer)
            writer.close()


@contextlib.asynccontextmanager
async def peer(handler: Handler) -> AsyncIterator[Peer]:
    state = Peer(handler)
    server = await asyncio.start_server(state._serve, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        for writer in list(state.writers):  # ends the handlers still reading
            writer.transport.abort()
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
    return head + await reader.readexactly(int(length.group(1)) if length else 0)


def sized(body: bytes, *extra: str) -> bytes:
    headers = "".join(f"{h}\r\n" for h in extra)
    return f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n{headers}\r\n".encode() + body


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        request = await read_request(reader)
        writer.write(sized(request.split(b"\r\n", 1)[0]))  # echoes the request line


@contextlib.asynccontextmanager
async def open_transport(
    *, keepalive_expiry_s: float = 4.0, max_connections: int = 256
) -> AsyncIterator[HTTPTransport]:
    http = HTTPTransport(keepalive_expiry_s=keepalive_expiry_s, max_connections=max_connections)
    try:
        yield http
    finally:
        await http.aclose()


async def fetch(http: HTTPTransport, url: str, body: bytes | None = None, timeout_s: float = 2.0) -> bytes:
    response = await http.request("POST" if body is not None else "GET", url, body, timeout_s=timeout_s)
    try:
        return await response.read()
    finally:
        response.close()


async def three_kinds(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    request = await read_request(reader)
    if b"/sized" in request:
        writer.write(sized(b'{"a": 1}', "content-type: application/json"))
        await read_request(reader)  # and the connection stays open
    elif b"/chunked" in request:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
        await read_request(reader)
    else:  # HTTP/1.0 style: the body ends when the connection does
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the end")
        await writer.drain()


async def test_sized_chunked_and_close_delimited_bodies() -> None:
    async with open_transport() as transport, peer(three_kinds) as server:
        response = await transport.request("POST", f"{server.url}/sized", b"{}", timeout_s=2)
        assert response.status == 200 and response.headers["content-type"] == "application/json"
        await response.read()
        assert response.json() == {"a": 1}
        assert await fetch(transport, f"{server.url}/chunked") == b"abcde"
        assert await fetch(transport, f"{server.url}/eof") == b"until the end"


async def echo_or_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        request = await read_request(reader)
        if b"/stream" not in request:
            writer.write(sized(request.split(b"\r\n", 1)[0]))  # echoes the request line
            continue
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await reader.read()  # the stream goes on until the client leaves


async def test_connections_are_reused_only_after_a_complete_answer() -> None:
    async with open_transport() as transport, peer(echo_or_stream) as server:
        for i in range(5):
            assert await fetch(transport, f"{server.url}/n{i}", b"x") == f"POST /n{i} HTTP/1.1".encode()
        assert server.accepted == 1
        stream = await transport.request("GET", f"{server.url}/stream", timeout_s=2)
        assert await anext(stream.iter_bytes()) == b"first"
        stream.close()  # closed before its end: the connection goes, and the peer sees it go
        async with asyncio.timeout(2):
            while server.closed == 0:
                await asyncio.sleep(0.01)
        await fetch(transport, f"{server.url}/again")
        assert server.accepted == 2


BIG_BODY = bytes(range(256)) * 8192  # 2 MiB: past the pause threshold many times


async def big(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(sized(BIG_BODY))
    await writer.drain()


async def test_a_large_body_arrives_whole_through_flow_control() -> None:
    async with open_transport() as transport, peer(big) as server:
        response = await transport.request("GET", server.url, timeout_s=5)
        received = bytearray()
        async for piece in response.iter_bytes():
            received += piece
            await asyncio.sleep(0)  # a slow reader
        assert bytes(received) == BIG_BODY


async def one_answer_then_drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(sized(b"first"))  # keep-alive by default, yet the next request finds it gone
    await read_request(reader)


async def test_a_connection_the_peer_dropped_while_idle_is_retried_once() -> None:
    async with open_transport() as transport, peer(one_answer_then_drop) as server:
        assert await fetch(transport, server.url) == b"first"
        assert await fetch(transport, server.url) == b"first"  # sent again on a fresh connection
        assert server.accepted == 2


async def test_the_retry_after_a_dropped_connection_takes_a_fresh_one() -> None:
    """Two idle connections both dropped by the peer: the retry does not take the other stale one."""
    async with open_transport() as transport, peer(one_answer_then_drop) as server:
        assert await asyncio.gather(fetch(transport, server.url), fetch(transport, server.url)) == [b"first"] * 2
        assert server.accepted == 2
        assert await fetch(transport, server.url) == b"first"
        assert server.accepted == 3


async def test_idle_connections_expire() -> None:
    async with open_transport(keepalive_expiry_s=0.05) as http, peer(keep_alive) as server:
        await fetch(http, server.url)
        await asyncio.sleep(0.1)
        await fetch(http, server.url)
        assert server.accepted == 2


async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"SMTP ready\r\n\r\n")
    await writer.drain()
    await reader.read()


async def cut_short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")


async def head_then_silence(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    await reader.read()


async def test_failures_are_transport_errors() -> None:
    async with open_transport() as transport:
        async with peer(garbage) as server:
            with pytest.raises(TransportError, match="malformed"):
                await fetch(transport, server.url)
        async with peer(cut_short) as server:
            with pytest.raises(TransportError, match="closed the connection"):
                await fetch(transport, server.url)
        async with peer(head_then_silence) as server:
            with pytest.raises(TransportTimeout):
                await fetch(transport, server.url, timeout_s=0.2)
        async with peer(keep_alive) as server:
            url = server.url
        with pytest.raises(TransportError, match="cannot connect"):  # nothing listens there any more
            await fetch(transport, url)


async def trickle_then_silence(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Six body pieces 0.1 s apart, then nothing (the connection stays open)."""
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    for i in range(6):
        writer.write(f"1\r\n{i}\r\n".encode())
        await writer.drain()
        await asyncio.sleep(0.1)
    await reader.read()


async def test_a_body_wait_times_out_after_the_last_bytes_not_the_first_wait() -> None:
    """Waits for body bytes share one timer: a stream that keeps sending is never cut, however long it
    runs past one timeout, and one that goes silent is cut one timeout after its last bytes."""
    async with open_transport() as transport, peer(trickle_then_silence) as server:
        response = await transport.request("GET", server.url, timeout_s=0.3)
        loop = asyncio.get_running_loop()
        pieces: list[bytes] = []
        last_at = loop.time()
        with pytest.raises(TransportTimeout):
            async with asyncio.timeout(3):  # (a wait that never timed out would fail here instead)
                async for piece in response.iter_bytes():
                    pieces.append(piece)
                    last_at = loop.time()
        silent_s = loop.time() - last_at
        assert b"".join(pieces) == b"012345"  # 0.5 s of trickling, past the 0.3 s timeout
        assert 0.29 <= silent_s < 0.6, silent_s  # neither early nor a timer's period late
        response.close()


async def hold_or_echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        request = await read_request(reader)
        if b"/held" in request:  # a stream that never ends
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
            await reader.read()
            return
        writer.write(sized(request.split(b"\r\n", 1)[0]))


async def test_requests_past_max_connections_wait_for_a_slot() -> None:
    async with open_transport(max_connections=1) as http, peer(hold_or_echo) as server:
        held = await http.request("GET", f"{server.url}/held", timeout_s=2)
        with pytest.raises(TransportTimeout):  # no free connection within the timeout
            await http.request("GET", f"{server.url}/waits", timeout_s=0.1)
        later = asyncio.create_task(fetch(http, f"{server.url}/later"))
        await asyncio.sleep(0.05)
        assert not later.done()
        held.close()  # closed before its end: its connection goes, and the slot is free again
        assert await later == b"GET /later HTTP/1.1"
        assert server.accepted == 2


@pytest.mark.parametrize(
    "scenario",
    [
        test_sized_chunked_and_close_delimited_bodies,
        test_connections_are_reused_only_after_a_complete_answer,
        test_a_large_body_arrives_whole_through_flow_control,
        test_a_connection_the_peer_dropped_while_idle_is_retried_once,
        test_failures_are_transport_errors,
        test_a_body_wait_times_out_after_the_last_bytes_not_the_first_wait,
    ],
    ids=lambda scenario: scenario.__name__.removeprefix("test_"),
)
def test_on_uvloop(scenario: Callable[[], Awaitable[None]]) -> None:
    """The gateway runs on uvloop (uvicorn picks it), whose transports differ from asyncio's."""
    uvloop.run(scenario())


async def test_a_connect_timeout_that_only_a_stalled_event_loop_caused_is_retried() -> None:
    """The loop stalls past the connect timeout right after connecting starts (a burst of requests
    each doing its setup in one turn): the loopback connection was made at once, but the timer and
    the connection are seen in the same turn and the timer used to win, failing a healthy backend."""
    import time

    async with peer(keep_alive) as server:
        http = HTTPTransport(connect_timeout_s=0.2)
        try:
            for _ in range(3):
                request = asyncio.ensure_future(http.request("GET", server.url + "/x", timeout_s=5))
                await asyncio.sleep(0)
                await asyncio.sleep(0)  # connecting has begun
                time.sleep(0.5)  # the whole event loop is stalled past the 0.2 s connect timeout
                response = await request
                assert response.status == 200
                await response.read()
                await http.aclose()
                http = HTTPTransport(connect_timeout_s=0.2)  # a new connection each time
        finally:
            await http.aclose()
