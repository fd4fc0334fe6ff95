"""contracts/streaming.py: items ready together go out in one body message, a wait flushes what
came before it, and a client that leaves ends the response quietly with its iterator closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from contracts.streaming import CoalescingStreamingResponse

SCOPE = {"type": "http", "asgi": {"spec_version": "2.3"}}


async def _never_disconnects() -> dict[str, Any]:
    await asyncio.Event().wait()
    return {"type": "http.disconnect"}


async def test_ready_items_are_joined_and_a_wait_flushes_them() -> None:
    async def items() -> AsyncIterator[bytes]:
        yield b"a"
        yield b"b"  # ready at once: joined with a
        await asyncio.sleep(0.01)
        yield b"c"
        yield b"d"

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await CoalescingStreamingResponse(items())(SCOPE, _never_disconnects, send)
    bodies = [(m["body"], m["more_body"]) for m in sent if m["type"] == "http.response.body"]
    assert bodies == [(b"ab", True), (b"cd", False)]
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200


async def test_a_leaving_client_closes_the_iterator_and_ends_quietly() -> None:
    closed = asyncio.Event()
    left = asyncio.Event()

    async def items() -> AsyncIterator[bytes]:
        try:
            yield b"first"
            await asyncio.Event().wait()  # a backend that never sends again
            yield b"never"
        finally:
            closed.set()

    async def receive() -> dict[str, Any]:
        await left.wait()
        return {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message.get("body") == b"first":
            left.set()

    async with asyncio.timeout(5):
        await CoalescingStreamingResponse(items())(SCOPE, receive, send)
    assert closed.is_set()
    assert [m.get("body") for m in sent if m["type"] == "http.response.body"] == [b"first"]
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]


async def test_text_items_are_encoded_and_non_coroutine_iterators_work() -> None:
    class Futures:
        """An async iterator whose steps are plain futures, not coroutines."""

        def __init__(self) -> None:
            self.items = ["é", b"x"]

        def __aiter__(self) -> Futures:
            return self

        def __anext__(self) -> asyncio.Future[object]:
            future = asyncio.get_running_loop().create_future()
            if self.items:
                future.set_result(self.items.pop(0))
            else:
                future.set_exception(StopAsyncIteration())
            return future

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await CoalescingStreamingResponse(Futures())(SCOPE, _never_disconnects, send)  # type: ignore[arg-type]
    assert b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body") == "é".encode() + b"x"
