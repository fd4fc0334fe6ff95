"""Who may start a generation now: bounded admission, and the backend's lifecycle state.

A backend holds at most `max_in_flight` requests: the engine's running batch (`max_running`) plus
`max_queue` waiting ones. Beyond that a request is refused at once (429), never parked in an
unbounded queue; a request that may not queue (the gateway's `x-edgerun-reject-if-busy`, a
client's `options.rejectIfBusy`) is refused as soon as the running batch is full. Until the engine
is ready, and once draining has begun, every request is refused (503).
Draining lets admitted requests finish until a deadline; `drain` returns those still running so
the caller can abort them.
"""

from __future__ import annotations

import asyncio
import enum

from backends.server.errors import Overloaded, Unavailable


class Phase(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPED = "stopped"


class Admission:
    def __init__(self, max_in_flight: int, max_running: int | None = None) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.max_in_flight = max_in_flight
        self.max_running = min(max_running or max_in_flight, max_in_flight)  # the engine's batch
        self.phase = Phase.STARTING
        self._active: set[str] = set()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def num_active(self) -> int:
        return len(self._active)

    @property
    def is_ready(self) -> bool:
        return self.phase is Phase.READY

    def admit(self, request_id: str, *, may_queue: bool = True) -> None:
        """Take a slot for `request_id`, or raise Unavailable (503) / Overloaded (429); one that may not
        queue is refused once the running batch is full."""
        if self.phase is Phase.STARTING:
            raise Unavailable("the backend is still loading its model: retry shortly")
        if self.phase is not Phase.READY:
            raise Unavailable("the backend is shutting down: send the request to another backend")
        if len(self._active) >= self.max_in_flight:
            raise Overloaded(
                f"{len(self._active)} requests are in flight, the most this backend queues: retry later or elsewhere"
            )
        if not may_queue and len(self._active) >= self.max_running:
            raise Overloaded(
                f"busy: the engine runs {self.max_running} requests at once and all are taken, and this request "
                "may not wait in the queue (reject-if-busy): retry later or elsewhere"
            )
        self._active.add(request_id)
        self._idle.clear()

    def is_active(self, request_id: str) -> bool:
        return request_id in self._active

    def release(self, request_id: str) -> None:
        self._active.discard(request_id)
        if not self._active:
            self._idle.set()

    def mark_ready(self) -> None:
        if self.phase is Phase.STARTING:
            self.phase = Phase.READY

    async def drain(self, timeout_s: float) -> list[str]:
        """Refuse new requests, wait up to `timeout_s` for admitted ones; return those left."""
        if self.phase in (Phase.STARTING, Phase.READY):
            self.phase = Phase.DRAINING
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            pass
        return sorted(self._active)
