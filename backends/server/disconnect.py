"""Stop work the moment the HTTP client goes away.

`until_disconnect(receive, awaitable)` runs `awaitable` while watching the ASGI `receive`
channel for `http.disconnect` (the request body must already be read); if the client leaves
first, the work is cancelled and ClientGone is raised. Streaming responses get the same
behaviour from Starlette's StreamingResponse, which cancels the body iterator on disconnect.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the answer was ready."""


async def _wait_for_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, awaitable: Awaitable[T]) -> T:
    work = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_wait_for_disconnect(receive))
    try:
        await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        raise ClientGone
    finally:
        for task in (watcher, work):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
