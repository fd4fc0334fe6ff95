"""`LeaseTask`: a store's lease-renewal loop, started by the first lease taken and stopped once at close.

The Redis store and the shared SQLite store both hold a replica's in-flight counts under a lease that a
background loop renews; each writes its own renewal, this owns the task around it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


class LeaseTask:
    def __init__(self, name: str, renew_loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self._name = name
        self._renew_loop = renew_loop
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def start(self) -> None:
        """Start the loop unless it runs already or the store is closing."""
        if self._task is None and not self._stopped:
            self._task = asyncio.get_running_loop().create_task(self._renew_loop(), name=self._name)

    async def stop(self) -> None:
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
