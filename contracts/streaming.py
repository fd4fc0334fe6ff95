"""A streamed response that writes together what is ready together, and stops when the client leaves.

Starlette's `StreamingResponse` sends each item of its iterator as its own ASGI message (one
socket write each: ten for an eight-chunk answer) and, under uvicorn's ASGI 2.3, runs an anyio
task group per response to notice a client that leaves. `CoalescingStreamingResponse` (the base
of `contracts.sse.EventStream`, so of the gateway's and the backends' streams) does the same job
with less per event:

- Items the iterator produces without waiting (the backend's chunks that came in one read, or
  piled up while this process was busy) are joined into one message: the iterator's next step
  is run at once (`step_now`) and only when it has to wait is what came so far written out.
  Nothing is held back: a write happens before every wait, and past `max_batch_bytes`.
- A plain asyncio task waits for `http.disconnect` and cancels the streaming task; the
  cancellation closes the iterator (so the backend stream is closed and the backend aborts)
  and the response ends quietly, as Starlette's does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Generator
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

_END = object()  # the iterator is exhausted


class _Rest:
    """The remainder of an awaitable whose first step has already run (it yielded `pending`)."""

    def __init__(self, step: Any, pending: Any) -> None:
        self._step = step
        self._pending = pending

    def __await__(self) -> Generator[Any, Any, Any]:
        pending = self._pending
        while True:
            try:
                received = yield pending
            except BaseException as exc:  # cancellation and the like go on into the step
                try:
                    pending = self._step.throw(exc)
                except StopIteration as done:
                    return done.value
            else:
                try:
                    pending = self._step.send(received)
                except StopIteration as done:
                    return done.value


def step_now(iterator: AsyncIterator[bytes]) -> tuple[bool, Any]:
    """Run the iterator's next step until it would wait: (True, item or _END) if it finished
    without waiting, else (False, an awaitable that finishes it)."""
    step: Any = anext(iterator)
    if not hasattr(step, "send"):  # an awaitable that is not a coroutine (a future): just await it
        return False, step
    try:
        pending = step.send(None)
    except StopIteration as done:
        return True, done.value
    except StopAsyncIteration:
        return True, _END
    return False, _Rest(step, pending)


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class CoalescingStreamingResponse(StreamingResponse):
    """A `StreamingResponse` that batches ready items and watches for the client leaving with one task."""

    max_batch_bytes = 65_536

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.current_task()
        assert streaming is not None
        left = False

        def client_left(watcher: asyncio.Future[None]) -> None:
            nonlocal left
            if not watcher.cancelled() and watcher.exception() is None:
                left = True
                streaming.cancel()

        watcher = asyncio.ensure_future(_until_disconnect(receive))
        watcher.add_done_callback(client_left)
        try:
            await self._stream(send)
        except asyncio.CancelledError:
            if not left:
                raise
            streaming.uncancel()  # ours: the client went away, which ends the response normally
        finally:
            watcher.remove_done_callback(client_left)
            watcher.cancel()

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        iterator = aiter(self.body_iterator)
        batch: list[bytes] = []
        size = 0
        try:
            while True:
                ready, item = step_now(iterator)  # type: ignore[arg-type]
                if not ready:
                    if batch:
                        await send({"type": "http.response.body", "body": b"".join(batch), "more_body": True})
                        batch, size = [], 0
                    try:
                        item = await item
                    except StopAsyncIteration:
                        break
                elif item is _END:
                    break
                if isinstance(item, str):
                    item = item.encode(self.charset)
                batch.append(item)
                size += len(item)
                if size >= self.max_batch_bytes:
                    await send({"type": "http.response.body", "body": b"".join(batch), "more_body": True})
                    batch, size = [], 0
        finally:
            if hasattr(iterator, "aclose"):
                await iterator.aclose()
        await send({"type": "http.response.body", "body": b"".join(batch), "more_body": False})
