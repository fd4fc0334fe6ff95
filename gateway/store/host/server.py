"""The store host: one process per machine serving one `EmbeddedStore` to the gateway workers.

Each worker holds one connection to the host's Unix socket. Every call runs on the host's event
loop, one at a time, as it would in a lone gateway: the embedded store's check-and-change calls
complete without suspending, so no two ever interleave and N workers never allow N x a limit,
with no lock between processes. What one read of the socket brings is decoded at once, each call
run on the spot (eager.py: a call that waits on SQLite goes on from the loop when its answer is
there, without a task) and the replies of that batch written together; replies of calls that
waited go out when they finish (they carry their call ids). When a connection closes, the slots
and in-flight tokens it took are freed at once (`holdings.py`). A frame that breaks the format
closes its connection, an unknown method or wrong arguments get an error reply; neither reaches
the store.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, cast

import structlog

from gateway.store import errors
from gateway.store.embedded import EmbeddedStore
from gateway.store.host import socket_file
from gateway.store.host.codec import record
from gateway.store.host.eager import resume_later, run_eagerly
from gateway.store.host.holdings import Holdings
from gateway.store.host.protocol import (
    BAD_REQUEST,
    METHODS,
    OK,
    FrameReader,
    ProtocolError,
    error_reply,
    frame,
    frame_each,
)

log = structlog.get_logger("edgerun.store.host")
Handler = Callable[..., Coroutine[Any, Any, Any]]
_OWNED = ("acquire_request_slot", "release_request_slot", "add_inflight", "release_inflight", "correct_inflight")


class StoreHost:
    def __init__(self, store: EmbeddedStore, path: str) -> None:
        """Serve `store` on the Unix socket `path` once `start` is awaited; `close` ends both."""
        self.path = path
        self.store = store
        self.holdings = Holdings(store)
        self.connections: set[_Connection] = set()
        self.stopping = False
        self.waiting = 0  # calls under way that wait (on SQLite)
        self.drained: asyncio.Future[None] | None = None  # set when `waiting` drops to 0 while closing
        self._base: dict[str, Handler] = {name: getattr(store, name) for name in METHODS if name not in _OWNED}
        self._base["append_usage"] = self._append_usage
        self._socket: socket.socket | None = None
        self._server: asyncio.Server | None = None
        self._inode = 0

    def bind(self) -> None:
        """Create the socket file (`socket_file.SocketInUse` if a host is live there): from now on
        workers can connect, and are accepted once `start` runs."""
        self._socket, self._inode = socket_file.bind_private(self.path)

    async def start(self) -> None:
        """Bind (unless done) and accept workers."""
        if self._socket is None:
            self.bind()
        self._server = await asyncio.get_running_loop().create_unix_server(lambda: _Connection(self), sock=self._socket)

    def handlers(self, owner: _Connection) -> dict[str, Handler]:
        """The callable methods for one connection: the store's, with slots and tokens booked to `owner`."""
        table = dict(self._base)
        for name in _OWNED:
            table[name] = partial(getattr(self.holdings, name), owner)
        return table

    async def _append_usage(self, data: Any) -> bool:
        return await self.store.append_usage(record(data))

    async def close(self) -> None:
        """Stop accepting, answer the calls under way, close the connections and the store (the
        ledger's queued records commit), remove the socket file."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        while self.waiting:
            self.drained = asyncio.get_running_loop().create_future()
            await self.drained
        for connection in list(self.connections):
            connection.close()
        await self.store.aclose()
        if self._socket is not None:
            self._socket.close()
            socket_file.remove(self.path, self._inode)


class _Connection(asyncio.Protocol):
    """One worker's connection: its calls, their replies, and what it holds."""

    def __init__(self, host: StoreHost) -> None:
        self._host = host
        self._reader = FrameReader()
        self._out: list[list[Any]] = []  # replies not sent yet
        self._batching = False
        self._flush_due = False
        self._transport: asyncio.Transport | None = None
        self._handlers: dict[str, Handler] = {}

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's classes
        self._handlers = self._host.handlers(self)
        self._host.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._host.connections.discard(self)
        if not self._host.stopping:
            run_eagerly(self._host.holdings.release_all(self), self._freed)

    def _freed(self, freed: tuple[int, int] | None, error: BaseException | None) -> None:
        if error is not None:
            log.error("store_host_release_failed", error=repr(error))
        elif freed is not None and freed != (0, 0):
            log.info("store_host_worker_gone", slots_freed=freed[0], backends_freed=freed[1])

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()  # what is buffered is still sent

    # --- flow control: a worker that stops reading its replies stops being read ---

    def pause_writing(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None:
            self._transport.resume_reading()

    # --- calls ---

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._reader.feed(data)
        except ProtocolError as exc:
            log.warning("store_host_bad_frame", error=str(exc))
            assert self._transport is not None
            self._transport.abort()
            return
        self._batching = True
        try:
            for message in messages:
                if self._transport is None or self._transport.is_closing():
                    break  # a bad request closed it: the rest of the batch goes unanswered
                self._call(message)
        finally:
            self._batching = False
        self._flush()

    def _call(self, message: Any) -> None:
        if not (isinstance(message, list) and len(message) == 4 and type(message[0]) is int):
            log.warning("store_host_bad_request", request=repr(message)[:200])
            assert self._transport is not None
            self._transport.abort()  # without a call id there is nobody to answer
            return
        call_id, method, args, kwargs = message
        handler = self._handlers.get(method) if isinstance(method, str) else None
        if handler is None:
            self._send([call_id, BAD_REQUEST, f"no such method: {str(method)[:100]!r}"])
            return
        if self._host.stopping:
            self._send(error_reply(call_id, errors.StoreUnavailable("the store host is stopping")))
            return
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            self._send([call_id, BAD_REQUEST, "args must be a list and kwargs an object"])
            return
        try:
            coro = handler(*args, **kwargs)
        except TypeError as exc:  # wrong arguments for the method
            self._send([call_id, BAD_REQUEST, str(exc)])
            return
        try:  # eager.run_eagerly, inlined: this runs for every call
            yielded = coro.send(None)
        except StopIteration as stop:
            self._send([call_id, OK, stop.value])
            return
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - the call's error, answered
            self._done(call_id, None, exc)
            return
        self._host.waiting += 1
        resume_later(coro, yielded, partial(self._done_later, call_id))

    def _done_later(self, call_id: int, result: Any, error: BaseException | None) -> None:
        self._host.waiting -= 1
        self._done(call_id, result, error)
        if self._host.waiting == 0 and self._host.drained is not None and not self._host.drained.done():
            self._host.drained.set_result(None)

    def _done(self, call_id: int, result: Any, error: BaseException | None) -> None:
        if error is None:
            self._send([call_id, OK, result])
            return
        if not isinstance(error, errors.StoreError):
            log.warning("store_host_call_failed", error=repr(error))
        self._send(error_reply(call_id, error))

    def _send(self, reply: list[Any]) -> None:
        self._out.append(reply)
        if not self._batching and not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_due = False
        replies, self._out = self._out, []
        if not replies or self._transport is None or self._transport.is_closing():
            return
        try:
            data = frame(replies)
        except (TypeError, ValueError):  # a result without a codec (a bug here) or too long to send
            data = frame_each(replies, _unsendable)
        self._transport.write(data)


def _unsendable(reply: list[Any], exc: Exception) -> list[Any]:
    log.error("store_host_reply_unsendable", error=repr(exc))
    return error_reply(reply[0], errors.StoreError(f"the store host cannot send this result: {exc}"))
