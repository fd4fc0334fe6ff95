"""CPU-heavy request work off the event loop, in a small bounded thread pool.

Parsing a large JSON body, rendering a chat template over a long conversation and tokenizing
its text take milliseconds per KiB; a 1 MB conversation costs over a second of CPU. Done on the
event loop, that stalls every other request (health checks included). `Offload.run` does it on
one of `threads` worker threads instead (the tokenizers' Rust code and most of the JSON decoder
release the GIL, so the loop keeps serving), and refuses new work with 429 when `max_pending`
jobs are already running or queued, so a flood of large requests queues a bounded amount of
work instead of taking every core. Small inputs (`is_large` false) stay inline: a thread hop
costs more than they do.

The pool is owned by the app's services and shut down with them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from gateway.errors import OutOfCapacity

T = TypeVar("T")
LARGE_INPUT_BYTES = 8192  # inputs above this many bytes (or characters) go to the pool


def is_large(size: int) -> bool:
    return size > LARGE_INPUT_BYTES


class Offload:
    def __init__(self, threads: int = 2, max_pending: int = 64) -> None:
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="edgerun-offload")
        self._max_pending = max_pending
        self._pending = 0

    @property
    def pending(self) -> int:
        return self._pending

    async def run(self, fn: Callable[[], T]) -> T:
        """`fn()` on a worker thread; OutOfCapacity (429) when the pool's queue is full."""
        if self._pending >= self._max_pending:
            raise OutOfCapacity(
                "Out of capacity: too many large requests are being prepared on this gateway; retry shortly",
                retry_after_s=1.0,
            )
        self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
        finally:
            self._pending -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
