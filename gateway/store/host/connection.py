"""A worker's connection to the store host: pipelined calls matched to replies by call id.

Calls made in the same turn of the event loop leave in one frame and one write (`call_soon`
flush). A call fails with `StoreUnavailable` when the connection is lost or no answer comes within
the timeout; one timer watches the oldest call (calls are answered roughly in order), not one
timer per call.

A call may carry a `late` callback for an answer that comes after its caller stopped waiting (the
call timed out, or its future was cancelled): the host may still have applied the call, and only
this connection sees that it did. `late(result)` then runs once, from the loop, for an "ok" answer
(an error answer changed nothing). It never runs when the connection closes first: whether the host
applied such a call is not known here. At most `MAX_LATE` timed-out calls are kept for their
answer (the oldest are forgotten first), so a host that never answers does not grow this without
bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

from gateway.store.errors import InvalidArgument, StoreUnavailable
from gateway.store.host.protocol import OK, FrameReader, ProtocolError, frame, frame_each, raised

Late = Callable[[Any], None]  # given the JSON result of an answer its caller no longer waited for
MAX_LATE = 10_000


class HostConnection(asyncio.Protocol):
    def __init__(self, path: str, timeout_s: float) -> None:
        self._path = path
        self._timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._reader = FrameReader()
        self._transport: asyncio.Transport | None = None
        self._out: list[list[Any]] = []  # calls not sent yet
        self._flush_due = False
        self._next_id = 0
        self._pending: dict[int, tuple[asyncio.Future[Any], float, Late | None]] = {}  # call id -> (reply, deadline, late)
        self._late: dict[int, Late] = {}  # timed-out calls still awaiting their answer, oldest first
        self._watch: asyncio.TimerHandle | None = None
        self.is_closed = False

    def call(
        self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any], late: Late | None = None
    ) -> asyncio.Future[Any]:
        """The future of the call's JSON result (or of the store error the host answered); `late`:
        see the module's docstring."""
        if self.is_closed:
            raise StoreUnavailable(f"the connection to the store host at {self._path} is closed")
        self._next_id += 1
        reply: asyncio.Future[Any] = self._loop.create_future()
        self._pending[self._next_id] = (reply, self._loop.time() + self._timeout_s, late)
        self._out.append([self._next_id, method, args, kwargs])
        if not self._flush_due:
            self._flush_due = True
            self._loop.call_soon(self._flush)
        if self._watch is None:
            self._watch = self._loop.call_later(self._timeout_s, self._expire)
        return reply

    def _flush(self) -> None:
        self._flush_due = False
        calls, self._out = self._out, []
        if self._transport is None or self.is_closed:
            return
        try:
            data = frame(calls)
        except (TypeError, ValueError):  # some call's arguments are not JSON, or too long: it fails alone
            data = frame_each(calls, self._refuse)
        self._transport.write(data)

    def _refuse(self, call: list[Any], exc: Exception) -> None:
        reply, _, _ = self._pending.pop(call[0])  # never sent: no late answer
        if not reply.done():
            reply.set_exception(
                InvalidArgument(f"{call[1]}: the arguments must be JSON values of bounded size ({exc})")
            )

    def _expire(self) -> None:
        """Fail the calls past their deadline; watch the oldest left."""
        self._watch = None
        now = self._loop.time()
        while self._pending:
            call_id, (reply, deadline, late) = next(iter(self._pending.items()))
            if deadline > now:
                self._watch = self._loop.call_at(deadline, self._expire)
                return
            del self._pending[call_id]
            if late is not None:
                self._late[call_id] = late
                if len(self._late) > MAX_LATE:
                    del self._late[next(iter(self._late))]
            if not reply.done():
                reply.set_exception(StoreUnavailable(
                    f"the store host at {self._path} did not answer within {self._timeout_s:g} s"
                ))  # fmt: skip

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # No isinstance check: uvloop (the gateway's loop under uvicorn) has transports of its own
        # classes, none of them an asyncio.Transport.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._reader.feed(data)
        except ProtocolError as exc:
            self._fail(f"the store host sent a broken frame ({exc})")
            return
        for message in messages:
            try:
                call_id, kind, value = message
                entry = self._pending.pop(call_id, None)
            except (TypeError, ValueError):  # not [call_id, kind, value]
                self._fail(f"the store host sent a malformed reply: {str(message)[:100]}")
                return
            if entry is None or entry[0].done():  # expired, or its caller gave up
                late = self._late.pop(call_id, None) if entry is None else entry[2]
                if late is not None and kind == OK:
                    self._loop.call_soon(late, value)
                continue
            reply = entry[0]
            if kind == OK:
                reply.set_result(value)
            else:
                reply.set_exception(raised(kind, value))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"the store host at {self._path} closed the connection" + (f" ({exc})" if exc else ""))

    def _fail(self, why: str) -> None:
        self.is_closed = True
        if self._transport is not None:
            self._transport.abort()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        self._late.clear()  # applied or not by the host: not known
        pending, self._pending = self._pending, {}
        for reply, _, _ in pending.values():
            if not reply.done():
                reply.set_exception(StoreUnavailable(why))

    def close(self) -> None:
        """Close at once; calls still waiting fail."""
        self._fail(f"the connection to the store host at {self._path} was closed")
