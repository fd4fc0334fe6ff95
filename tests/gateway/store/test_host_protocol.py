"""The store host's socket as an untrusted peer sees it: only store methods are callable, broken
frames close the connection and bad calls get an error reply, and the host goes on serving; its
socket file is private and never shared with a live host. And a worker facing a silent host gets
StoreUnavailable, not a hang."""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import GatewaySettings
from gateway.store import Store, StoreError, StoreUnavailable, TokensOverLimit
from gateway.store.embedded import EmbeddedStore
from gateway.store.host import socket_file
from gateway.store.host.client import HostedStore
from gateway.store.host.protocol import BAD_REQUEST, MAX_FRAME, METHODS, FrameReader, frame
from gateway.store.host.server import StoreHost
from gateway.store.settings import StoreSettings


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[StoreHost]:
    settings = GatewaySettings(redis_url=None, sqlite_path=str(tmp_path / "gateway.sqlite3")).store
    served = StoreHost(EmbeddedStore(settings), str(tmp_path / "run" / "store.sock"))
    await served.start()
    yield served
    await served.close()


def _client(host: StoreHost, **overrides: Any) -> HostedStore:
    return HostedStore(StoreSettings(sqlite_path=":memory:", store_socket=host.path, **overrides))


class _Peer:
    """A raw connection to the host, speaking frames by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self._frames = FrameReader()

    async def ask(self, *message: Any) -> list[Any]:
        self.writer.write(frame([list(message)]))
        return await self.answer()

    async def answer(self) -> list[Any]:
        while True:
            data = await asyncio.wait_for(self.reader.read(65536), 5)
            assert data, "the host closed the connection"
            replies = self._frames.feed(data)
            if replies:
                assert len(replies) == 1
                reply: list[Any] = replies[0]
                return reply

    async def is_closed_by_host(self) -> bool:
        return await asyncio.wait_for(self.reader.read(65536), 5) == b""

    def close(self) -> None:
        self.writer.close()


async def _peer(host: StoreHost) -> _Peer:
    return _Peer(*await asyncio.open_unix_connection(host.path))


def test_only_the_store_methods_are_callable() -> None:
    contract = {name for name, fn in inspect.getmembers(Store, inspect.isfunction) if not name.startswith("_")}
    assert METHODS == (contract - {"iter_usage", "aclose"}) | {"usage_page"}
    assert all(callable(getattr(EmbeddedStore, name)) for name in METHODS)


async def test_bad_calls_get_an_error_and_the_connection_goes_on(host: StoreHost) -> None:
    peer = await _peer(host)
    try:
        for method in ("aclose", "_run", "__init__", "__class__", 7, None):
            reply = await peer.ask(1, method, [], {})
            assert reply[:2] == [1, BAD_REQUEST] and "no such method" in reply[2]
        assert (await peer.ask(2, "get_tenant", [], {}))[:2] == [2, BAD_REQUEST]  # missing argument
        assert (await peer.ask(3, "get_tenant", ["a"], {"evil": 1}))[:2] == [3, BAD_REQUEST]
        assert (await peer.ask(4, "get_tenant", {"a": 1}, {}))[:2] == [4, BAD_REQUEST]
        assert (await peer.ask(5, "get_tenant", [["unhashable"]], {}))[:2] == [5, BAD_REQUEST]
        assert (await peer.ask(6, "append_usage", [{"request_id": "r"}], {}))[:2] == [6, "InvalidArgument"]
        reply = await peer.ask(7, "acquire_request_slot", ["acme", "r1", "many"], {})
        assert reply[:2] == [7, "InvalidArgument"] and "limit" in reply[2]
        assert await peer.ask(8, "acquire_request_slot", ["acme", "r1", 1], {}) == [8, "ok", True]
    finally:
        peer.close()


@pytest.mark.parametrize(
    "garbage",
    [
        (MAX_FRAME + 1).to_bytes(4, "big") + b"[]",  # longer than any frame may be
        (5).to_bytes(4, "big") + b"\xff\xfe{[x",  # not UTF-8 JSON
        (10).to_bytes(4, "big") + b'{"call":1}',  # JSON, but not an array of messages
        (3).to_bytes(4, "big") + b" []",  # a byte before the value
        (5).to_bytes(4, "big") + b"[] []",  # bytes after it
        (200_000).to_bytes(4, "big") + b"[" * 100_000 + b"]" * 100_000,  # nested past any recursion limit
        frame([{"call": 1}]),  # an array, but not of requests
        frame([[1.5, "get_tenant", ["a"], {}]]),  # no usable call id
    ],
)
async def test_a_broken_frame_closes_its_connection_only(host: StoreHost, garbage: bytes) -> None:
    other = _client(host)
    try:
        assert await other.acquire_request_slot("acme", "held", 1)
        peer = await _peer(host)
        peer.writer.write(garbage)
        assert await peer.is_closed_by_host()
        peer.close()
        assert not await other.acquire_request_slot("acme", "second", 1)  # the host serves on, state intact
    finally:
        await other.aclose()


async def test_errors_keep_their_type(host: StoreHost) -> None:
    store = _client(host)
    try:
        with pytest.raises(TokensOverLimit) as refused:
            await store.check_and_consume("key_a", None, 100, 1000)
        assert (refused.value.tokens, refused.value.tpm) == (1000, 100)
        with pytest.raises(TypeError):
            await store.append_usage({"request_id": "r"})  # type: ignore[arg-type]
        with pytest.raises(StoreError, match="arguments must be JSON"):
            await store.match_prefix([object()])  # type: ignore[list-item]
    finally:
        await store.aclose()


async def test_a_silent_host_is_unavailable_after_the_timeout(tmp_path: Path) -> None:
    path = str(tmp_path / "silent.sock")

    finished = asyncio.Event()
    received: list[Any] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader()
        while data := await reader.read(65536):
            received.extend(frames.feed(data))  # reads every call, answers none
        writer.close()
        await writer.wait_closed()
        finished.set()

    server = await asyncio.start_unix_server(swallow, path)
    store = HostedStore(StoreSettings(store_socket=path, redis_timeout_s=0.2, sqlite_busy_timeout_s=0.1))
    try:
        with pytest.raises(StoreUnavailable, match="did not answer"):
            await asyncio.wait_for(store.get_tenant("acme"), 5)
        calls = [store.loads() for _ in range(3)]  # pipelined calls each fail too, none hangs
        outcomes = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 5)
        assert all(isinstance(o, StoreUnavailable) for o in outcomes)
        with pytest.raises(StoreUnavailable):
            await asyncio.wait_for(store.acquire_request_slot("acme", "r1", 5), 5)
        # the host may still take that slot: its release follows at once, behind the acquire
        expected = [["acquire_request_slot", ["acme", "r1", 5]], ["release_request_slot", ["acme", "r1"]]]
        for _ in range(250):  # until the silent host has read it (at most 5 s)
            if [m[1:3] for m in received][-2:] == expected:
                break
            await asyncio.sleep(0.02)
        assert [m[1:3] for m in received][-2:] == expected
    finally:
        await store.aclose()
        await asyncio.wait_for(finished.wait(), 5)
        server.close()


async def test_the_socket_is_private_and_one_host_serves_a_path(host: StoreHost, tmp_path: Path) -> None:
    assert stat.S_IMODE(os.stat(host.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(Path(host.path).parent).st_mode) == 0o700
    with pytest.raises(socket_file.SocketInUse, match="already serving"):
        socket_file.bind_private(host.path)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(socket_file.SocketInUse, match="not private"):
        socket_file.bind_private(str(shared / "store.sock"))
    not_a_socket = tmp_path / "run" / "file"
    not_a_socket.write_text("keep me")
    with pytest.raises(socket_file.SocketInUse, match="not a socket"):
        socket_file.bind_private(str(not_a_socket))
    assert not_a_socket.read_text() == "keep me"


def test_a_dead_hosts_socket_file_is_replaced(tmp_path: Path) -> None:
    path = str(tmp_path / "run" / "store.sock")
    dead, _ = socket_file.bind_private(path)
    dead.close()  # the file stays, nobody listens
    sock, inode = socket_file.bind_private(path)
    with socket.socket(socket.AF_UNIX) as probe:
        probe.connect(path)
    sock.close()
    socket_file.remove(path, inode)
    assert not Path(path).exists()


async def test_an_acquire_cancelled_before_its_answer_does_not_keep_the_slot(host: StoreHost) -> None:
    """The caller never learns whether it got the slot, so it never releases it; the host must not
    keep it either (a live worker's connection stays open: nothing else would free it)."""
    client = _client(host)
    try:
        assert await client.acquire_request_slot("acme", "warm-up", 1)  # connected
        await client.release_request_slot("acme", "warm-up")
        call = asyncio.ensure_future(client.acquire_request_slot("acme", "cancelled", 1))
        await asyncio.sleep(0)  # sent (at the next turn), not answered yet
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await client.acquire_request_slot("acme", "next", 1)  # the limit of 1 is free again
    finally:
        await client.aclose()


def test_frames_split_anywhere_read_back_whole() -> None:
    messages = [[i, "ok", {"text": "x" * (i * 37 % 500), "n": i}] for i in range(200)]
    data = b"".join(frame(messages[i : i + 7]) for i in range(0, 200, 7))
    for step in (1, 3, 1000, 65536, len(data)):
        reader, read = FrameReader(), []
        for pos in range(0, len(data), step):
            read += reader.feed(data[pos : pos + step])
        assert read == messages
    big = frame([[1, "ok", "y" * 3_000_000]])  # one frame over many reads
    reader = FrameReader()
    assert all(reader.feed(big[pos : pos + 65536]) == [] for pos in range(0, len(big) - 65536, 65536))
    assert reader.feed(big[(len(big) - 1) // 65536 * 65536 :]) == [[1, "ok", "y" * 3_000_000]]


async def test_a_worker_sends_nothing_to_a_socket_another_user_serves(
    host: StoreHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket path in a directory others can write to (the host itself refuses one) may be served
    by another user's process: the worker would hand it every API key it looks up."""
    someone_else = os.getuid() + 1  # the host's process is this user's: seen from a different uid
    monkeypatch.setattr(os, "getuid", lambda: someone_else)
    client = _client(host)
    try:
        with pytest.raises(StoreUnavailable, match="uid"):
            await client.lookup_key("er-secret")  # refused once connected, before any call is sent
    finally:
        await client.aclose()


async def test_a_connect_whose_caller_was_cancelled_is_not_handed_out_later(host: StoreHost) -> None:
    """The attempt goes on for other callers; once done it is forgotten, so a call made after that
    connection closed opens a new one instead of getting the old, closed one."""
    client = _client(host)
    try:
        call = asyncio.ensure_future(client.loads())
        await asyncio.sleep(0)  # connecting
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        for _ in range(200):  # the attempt completes on its own
            if host.connections:
                break
            await asyncio.sleep(0.01)
        for connection in list(host.connections):
            connection.close()  # the host drops it (as when it restarts)
        for _ in range(200):
            if not host.connections:
                break
            await asyncio.sleep(0.01)
        for _ in range(200):  # the client reads the close
            if client._connection is None or client._connection.is_closed:
                break
            await asyncio.sleep(0.01)
        assert await client.loads() == {}  # a new connection, not StoreUnavailable
    finally:
        await client.aclose()
