"""Writes to one client made in the same turn of the event loop go out as one.

uvicorn writes each ASGI message to the socket when it is sent: a streamed answer's head, then
each body message, one system call each (on loopback a write does the receiver's TCP work too,
the largest single cost of a streamed request after Python itself). The gateway's streams send
the head and the events already there in one turn (contracts/streaming.py), so
`CoalescedWrites`, wrapped around each connection's transport, keeps the bytes written during a
turn and writes them together at its end (one `loop.call_soon`), or at once when the transport
is closed. Nothing waits past the turn it was written in.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any


class CoalescedWrites:
    """A transport whose writes in one turn of the loop become one write to `transport`; the
    rest of the transport's interface is the wrapped one's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def writelines(self, data: Iterable[bytes]) -> None:
        self.write(b"".join(data))

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if pending and not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, ...
        return getattr(self._transport, name)
