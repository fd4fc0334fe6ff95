"""An emulated WAN link for `edgerun dev --regions N`: an asyncio TCP proxy that delays every byte
by half a round trip each way, and can be cut.

`WanLink(upstream, rtt_ms)` listens on a loopback port and forwards to `upstream` (a home region's
Redis); a region's gateways and its tenancy replica reach home through it. Data read from either
side is written to the other `rtt_ms / 2` later, in order, without slowing what follows (a queue of
timestamped chunks per direction, like a long pipe rather than a slow one). `cut()` drops the open
connections and black-holes new ones (accepted, never answered), as a partition does; `restore()`
closes the black-holed ones, so clients reconnect at once, and forwards again. No root, no network
namespaces; `tc netem` does the same in a kernel, where one may use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass, field

_CHUNK = 65_536


@dataclass
class WanLink:
    upstream_host: str
    upstream_port: int
    rtt_ms: float = 0.0
    port: int = 0  # 0: a free one, known after `start`
    is_cut: bool = False
    chunks_to_home: int = 0  # pieces of data forwarded towards the upstream (about: requests sent over the link)
    _server: asyncio.Server | None = None
    _open: set[asyncio.StreamWriter] = field(default_factory=set)
    _held: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> WanLink:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        """Partition: open connections dropped, new ones held unanswered."""
        self.is_cut = True
        for writer in list(self._open):
            writer.transport.abort()

    def restore(self) -> None:
        self.is_cut = False
        for writer in list(self._held):
            writer.transport.abort()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for writer in [*self._open, *self._held]:
            writer.transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            self._held.add(writer)
            try:
                while await reader.read(_CHUNK):
                    pass
            except OSError:
                pass
            finally:
                self._held.discard(writer)
                writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.upstream_host, self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._open |= {writer, up_writer}
        pumps = [asyncio.create_task(self._pump(reader, up_writer, upward=True)),
                 asyncio.create_task(self._pump(up_reader, writer, upward=False))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._open -= {writer, up_writer}
            writer.transport.abort()
            up_writer.transport.abort()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, *, upward: bool) -> None:
        """Each chunk is written half a round trip (as `rtt_ms` is when it is read) after it was read;
        reading goes on meanwhile."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    with contextlib.suppress(OSError, RuntimeError):
                        sink.write_eof()
                    return
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                sink.write(data)
                await sink.drain()

        delivering = asyncio.create_task(deliver())
        try:
            while True:
                data = await source.read(_CHUNK)
                queue.put_nowait((time.monotonic() + self.rtt_ms / 2000, data))
                self.chunks_to_home += upward and bool(data)
                if not data:
                    break
            await delivering
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            delivering.cancel()
            await asyncio.gather(delivering, return_exceptions=True)


class WanThread:
    """WAN links on an event loop of their own, in a daemon thread: for callers that block (tests,
    `edgerun dev`'s start-up), and so a link's delays do not wait on their work."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="wan-links", daemon=True)
        self._thread.start()
        self.links: list[WanLink] = []

    def link(self, upstream_port: int, rtt_ms: float) -> WanLink:
        """A new link to 127.0.0.1:`upstream_port`, listening on a free loopback port."""
        found = asyncio.run_coroutine_threadsafe(WanLink("127.0.0.1", upstream_port, rtt_ms).start(), self._loop)
        link = found.result(timeout=10)
        self.links.append(link)
        return link

    def set_rtt(self, rtt_ms: float) -> None:
        """Every link's round trip from now on (open connections included)."""
        for link in self.links:
            link.rtt_ms = rtt_ms

    def cut(self) -> None:
        for link in self.links:
            self._loop.call_soon_threadsafe(link.cut)

    def restore(self) -> None:
        for link in self.links:
            self._loop.call_soon_threadsafe(link.restore)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    async def _close(self) -> None:
        for link in self.links:
            await link.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:  # their connections are closed: they end on their own
            _, pending = await asyncio.wait(tasks, timeout=2.0)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
