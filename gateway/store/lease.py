"""Replicas and their leases: what names this process's counts, and the loop that keeps them alive.

The Redis store and the shared SQLite store both hold a replica's slots and in-flight counts under
a lease that a background loop renews (`LeaseTask`: started by the first lease taken, stopped once
at close); each writes its own renewal. A replica that dies stops renewing, and its counts vanish
within `inflight_lease_s`.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
from collections.abc import Callable, Coroutine
from secrets import token_hex
from typing import Any


def default_replica_id() -> str:
    """host-pid-random: names this process's counts when `replica_id` is not set."""
    host = re.sub(r"[^A-Za-z0-9_.\-]", "-", socket.gethostname())[:80] or "gateway"
    return f"{host}-{os.getpid()}-{token_hex(3)}"


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
