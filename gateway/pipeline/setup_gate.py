"""A bound on how many requests do their CPU-bound setup at once.

Setting a request up (chat template, tokenizing, limit and budget checks, routing) is CPU work
with no real wait in it (the local store answers without suspending), so a burst of requests
that arrive together would otherwise each run its whole setup in one turn of the event loop. A
burst of 3,000 made one turn last seconds; timers armed in it (the backend connect timeout,
2 s) then expired in the next turn, before the connections that had long been made were seen:
most of that burst got 408s from a healthy backend. With at most `concurrency` requests in
setup, the others wait their turn in arrival order (the wait is bounded by the listener's
connection cap) and each turn of the loop stays short.

A request holds its place from tokenizing to its routing decision and gives it back before it
connects to the backend: waiting for the backend's first byte holds nothing. One that may not
wait (`options.rejectIfBusy`) is answered 429 / 3040 at once when no place is free.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from gateway.errors import busy


class SetupGate:
    def __init__(self, concurrency: int) -> None:
        self._places = asyncio.Semaphore(concurrency)

    def enter(self, *, may_wait: bool = True) -> Place:
        """`async with gate.enter() as place:` ... `place.leave()` once the setup is done; with
        `may_wait=False`, entering raises OutOfCapacity (`gateway.errors.busy`) instead of waiting."""
        return Place(self._places, may_wait)


class Place:
    """One request's place in the gate; `leave` early, or at the end of the `async with`."""

    def __init__(self, places: asyncio.Semaphore, may_wait: bool = True) -> None:
        self._places = places
        self._may_wait = may_wait
        self._held = False

    async def __aenter__(self) -> Place:
        if not self._may_wait and self._places.locked():  # every place taken, or others already waiting
            raise busy()
        await self._places.acquire()
        self._held = True
        return self

    def leave(self) -> None:
        if self._held:
            self._held = False
            self._places.release()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.leave()
