"""Server-sent events as both servers send them: the gateway to its clients, a backend to the gateway.

Each event is one `data: <compact JSON>` line and a blank line; a stream that ends well ends
with `data: [DONE]`. `EventStream` is the one streaming response both use: it runs its
`on_close` however the response ends (finished, client gone, or never iterated at all), which is
where the gateway settles a generation and a backend aborts the engine's request.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from contracts.streaming import CoalescingStreamingResponse

DONE = b"data: [DONE]\n\n"
HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}  # no proxy buffering of the stream

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))  # json.dumps would build one per call


def dumps(obj: Any) -> bytes:
    """Compact JSON as UTF-8 bytes (also the gateway's JSON bodies)."""
    return _ENCODER.encode(obj).encode()


def event(payload: Any) -> bytes:
    return b"data: " + dumps(payload) + b"\n\n"


class EventStream(CoalescingStreamingResponse):
    """An SSE response that always runs `on_close`, even when the client leaves before the body
    iterator ever starts; events ready together are written together (contracts/streaming.py)."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(content, headers=HEADERS)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()
