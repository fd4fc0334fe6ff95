"""The fault proxy itself, in front of an echo server: each fault does what it says."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from tests.gateway.fault_proxy import FaultProxy, Faults


@pytest.fixture
async def proxy() -> AsyncIterator[FaultProxy]:
    writers: set[asyncio.StreamWriter] = set()

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        with contextlib.suppress(ConnectionError):
            while data := await reader.read(1024):
                writer.write(data)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    running = await FaultProxy("127.0.0.1", server.sockets[0].getsockname()[1]).start()
    yield running
    await running.close()
    server.close()
    # The echo side of a connection the proxy dropped may not have seen its end yet; a writer
    # still open when the loop closes warns (ResourceWarning) when it is collected.
    for writer in writers:
        writer.close()
    await server.wait_closed()
    await asyncio.sleep(0)


async def roundtrip(proxy: FaultProxy, data: bytes, expect: int | None = None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(data)
        await writer.drain()
        got = b""
        async with asyncio.timeout(0.5):
            while len(got) < (expect or len(data)):
                chunk = await reader.read(1024)
                if not chunk:
                    break
                got += chunk
        return got
    finally:
        writer.close()


async def test_healthy_forwards_both_ways(proxy: FaultProxy) -> None:
    assert await roundtrip(proxy, b"hello") == b"hello"


async def test_stall_after_bytes_forwards_that_much_then_nothing(proxy: FaultProxy) -> None:
    proxy.faults = Faults(stall_after_bytes=3)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"hello")
    assert await reader.readexactly(3) == b"hel"
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await reader.read(1)
    writer.close()
    assert proxy.stats.stalls == 1


async def test_reset_and_reset_after_bytes_reset_the_connection(proxy: FaultProxy) -> None:
    proxy.faults = Faults(reset=True)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            writer.write(b"x")
            await reader.readexactly(1)
    finally:
        writer.close()
    proxy.faults = Faults(reset_after_bytes=2)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    try:
        writer.write(b"hello")
        assert await reader.readexactly(2) == b"he"
        with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
            await reader.readexactly(1)
    finally:
        writer.close()
    assert proxy.stats.resets == 2


async def test_a_black_hole_accepts_and_never_answers(proxy: FaultProxy) -> None:
    proxy.faults = Faults(black_hole=True)
    with pytest.raises(TimeoutError):
        await roundtrip(proxy, b"hello")


async def test_refused_then_accepted_again_on_the_same_port(proxy: FaultProxy) -> None:
    port = proxy.port
    await proxy.refuse()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)
    await proxy.accept()
    assert proxy.port == port and await roundtrip(proxy, b"back") == b"back"
