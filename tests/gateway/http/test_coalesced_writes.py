"""What one turn of the event loop writes to a client goes out as one write, never later than that turn."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.http.coalesced_writes import CoalescedWrites


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1234) if name == "peername" else default


def wrapped() -> tuple[CoalescedWrites, RecordingTransport]:
    transport = RecordingTransport()
    return CoalescedWrites(transport, asyncio.get_running_loop()), transport  # type: ignore[arg-type]


async def test_writes_of_one_turn_go_out_together_at_its_end() -> None:
    writes, transport = wrapped()
    writes.write(b"HTTP/1.1 200 OK\r\n\r\n")
    writes.writelines([b"5\r\n", b"hello\r\n"])
    assert transport.writes == []  # not yet: the turn is not over
    await asyncio.sleep(0)
    assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\n5\r\nhello\r\n"]
    writes.write(b"0\r\n\r\n")  # a later turn: its own write
    await asyncio.sleep(0)
    assert transport.writes[1:] == [b"0\r\n\r\n"]


async def test_close_writes_what_is_pending_first_and_abort_drops_it() -> None:
    writes, transport = wrapped()
    writes.write(b"last bytes")
    writes.close()
    assert transport.writes == [b"last bytes"] and transport.closed
    await asyncio.sleep(0)  # the scheduled flush finds nothing left
    assert transport.writes == [b"last bytes"]
    writes, transport = wrapped()
    writes.write(b"never sent")
    writes.abort()
    await asyncio.sleep(0)
    assert transport.writes == [] and transport.aborted


async def test_the_rest_of_the_interface_is_the_transports() -> None:
    writes, transport = wrapped()
    assert writes.get_extra_info("peername") == ("127.0.0.1", 1234)
    assert not writes.is_closing()
    transport.closed = True
    writes.write(b"to a closed transport")
    await asyncio.sleep(0)
    assert transport.writes == []
