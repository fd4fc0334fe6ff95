"""A fault-injecting TCP proxy, for putting a bad network between the gateway and a backend.

    python -m tests.gateway.fault_proxy --listen-port 9000 --upstream 127.0.0.1:8100 --latency-s 0.2

A test tool, not product code. `FaultProxy` forwards bytes between its clients and one upstream
address, doing to them what its current `Faults` say; the faults can be changed at any time
(`proxy.faults = Faults(...)`), and a change applies to connections already open as well as to
new ones, so a test can make a backend flap by switching between two of them:

- `latency_s`: every piece of data, either way, waits this long before it is forwarded;
- `reset`: a new connection is accepted and reset at once (RST); open ones are reset on their
  next piece of data;
- `black_hole`: a half-open peer: new connections are accepted and read, never answered, never
  closed;
- `stall_after_bytes`: after forwarding this many bytes from the upstream on one connection, the
  proxy forwards nothing more but keeps both sockets open (a stream stalled midway);
- `reset_after_bytes`: the same, but the connection is then reset (a stream broken midway).

`refuse()` closes the listening socket, so connections are refused, and `accept()` opens it
again on the same port. `ProxyThread` runs one proxy on its own event loop in a thread, for
synchronous tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import struct
import sys
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

CHUNK_BYTES = 65_536
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Faults:
    latency_s: float = 0.0
    reset: bool = False
    black_hole: bool = False
    stall_after_bytes: int | None = None
    reset_after_bytes: int | None = None


HEALTHY = Faults()


@dataclass(slots=True)
class ProxyStats:
    connections: int = 0  # accepted
    resets: int = 0  # connections the proxy reset
    stalls: int = 0  # connections the proxy stopped forwarding on
    bytes_down: int = 0  # upstream -> client, forwarded


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST rather than a FIN (SO_LINGER 0), as a crashed peer or a middlebox does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass
class FaultProxy:
    upstream_host: str
    upstream_port: int
    port: int = 0  # 0: a free one, known after `start`
    faults: Faults = HEALTHY
    stats: ProxyStats = field(default_factory=ProxyStats)
    _server: asyncio.Server | None = None
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def refuse(self) -> None:
        """Stop listening: new connections are refused (open ones carry on)."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def accept(self) -> None:
        """Listen again, on the same port."""
        if self._server is None:
            await self.start()

    def reset_all(self) -> None:
        """Reset every open connection now."""
        for writer in list(self._writers):
            self.stats.resets += 1
            _reset(writer)

    async def close(self) -> None:
        await self.refuse()
        for writer in list(self._writers):
            writer.transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        faults = self.faults
        if faults.reset:
            self.stats.resets += 1
            _reset(writer)
            return
        self._writers.add(writer)
        try:
            if faults.black_hole:
                while await reader.read(CHUNK_BYTES):
                    pass
                return
            try:
                up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
            except OSError:
                _reset(writer)
                return
            self._writers.add(up_writer)
            try:
                pumps = [
                    asyncio.create_task(self._pump(reader, up_writer, writer, downstream=False)),
                    asyncio.create_task(self._pump(up_reader, writer, writer, downstream=True)),
                ]
                _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            finally:
                self._writers.discard(up_writer)
                up_writer.transport.abort()
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    async def _pump(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, client: asyncio.StreamWriter, *, downstream: bool
    ) -> None:
        """Copy source -> sink until EOF, applying the faults to each piece (the byte limits only
        to what flows down to the client)."""
        forwarded = 0
        while True:
            try:
                data = await source.read(CHUNK_BYTES)
            except (ConnectionError, OSError):
                return
            if not data:
                with contextlib.suppress(OSError, RuntimeError):
                    sink.write_eof()
                return
            faults = self.faults
            if faults.latency_s > 0:
                await asyncio.sleep(faults.latency_s)
            if faults.reset:
                self.stats.resets += 1
                _reset(client)
                return
            limit = None
            if downstream:
                limit = min(x for x in (faults.stall_after_bytes, faults.reset_after_bytes, 1 << 62) if x is not None)
            if limit is not None and forwarded + len(data) > limit:
                data = data[: max(0, limit - forwarded)]
                if data:
                    sink.write(data)
                    await sink.drain()
                    self.stats.bytes_down += len(data)
                if faults.reset_after_bytes is not None and faults.reset_after_bytes == limit:
                    self.stats.resets += 1
                    _reset(client)
                    return
                self.stats.stalls += 1
                await asyncio.Event().wait()  # stalled: until the other direction ends the connection
            try:
                sink.write(data)
                await sink.drain()
            except (ConnectionError, OSError):
                return
            forwarded += len(data)
            if downstream:
                self.stats.bytes_down += len(data)


class ProxyThread:
    """A FaultProxy on its own event loop in a daemon thread; its methods may be called from any thread."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        self.proxy = self._run(FaultProxy(upstream_host, upstream_port).start())

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    def set(self, faults: Faults) -> None:
        self.proxy.faults = faults  # one attribute store: atomic for the proxy's loop

    def refuse(self) -> None:
        self._run(self.proxy.refuse())

    def accept(self) -> None:
        self._run(self.proxy.accept())

    def reset_all(self) -> None:
        self._loop.call_soon_threadsafe(self.proxy.reset_all)

    def close(self) -> None:
        self._run(self.proxy.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()  # an event loop left open warns (ResourceWarning) when it is collected

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)


@contextlib.contextmanager
def running_proxy(upstream_host: str, upstream_port: int) -> Iterator[ProxyThread]:
    proxy = ProxyThread(upstream_host, upstream_port)
    try:
        yield proxy
    finally:
        proxy.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gateway.fault_proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--listen-port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--latency-s", type=float, default=0.0)
    parser.add_argument("--stall-after-bytes", type=int)
    parser.add_argument("--reset-after-bytes", type=int)
    parser.add_argument("--black-hole", action="store_true")
    parser.add_argument("--reset", action="store_true")
    args = parser.parse_args(argv)
    host, _, port = args.upstream.rpartition(":")
    faults = Faults(args.latency_s, args.reset, args.black_hole, args.stall_after_bytes, args.reset_after_bytes)

    async def serve() -> None:
        proxy = await FaultProxy(host, int(port), args.listen_port, faults).start()
        print(f"fault proxy on 127.0.0.1:{proxy.port} -> {args.upstream}: {faults}", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
