"""One thread that runs blocking calls (SQLite) in the order they were asked for, off the event loop.

What `ThreadPoolExecutor(max_workers=1)` + `run_in_executor` does, with the hand-offs batched:
calls asked for while the thread is busy run one after another in its next wake-up, and their
results go back to the loop in one callback. Under load (many requests each making a few store
calls) that is one thread wake-up and one loop wake-up for many calls instead of two per call.
A call whose caller was cancelled still runs (as in an executor once queued): the store's writes
are never half-done.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_Job = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]"]
_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]


class SerialWorker:
    def __init__(self, name: str) -> None:
        self._jobs: list[_Job] = []
        self._ready = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the worker thread, after every call asked for before it."""
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the store's worker thread is closed")
            self._jobs.append((fn, args, done))
            if len(self._jobs) == 1:
                self._ready.notify()
        return await done

    def close(self) -> None:
        """Run what is queued, then stop the thread (and wait for it)."""
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join()

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._jobs and not self._closed:
                    self._ready.wait()
                if not self._jobs:
                    return
                jobs, self._jobs = self._jobs, []
            outcomes: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
            for fn, args, done in jobs:
                try:
                    outcome: _Outcome = (done, fn(*args), None)
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    outcome = (done, None, exc)
                outcomes.setdefault(done.get_loop(), []).append(outcome)
            for loop, settled in outcomes.items():
                try:
                    loop.call_soon_threadsafe(_settle, settled)
                except RuntimeError:  # that loop is closed: nobody waits for these any more
                    pass


def _settle(outcomes: list[_Outcome]) -> None:
    for done, result, exc in outcomes:
        if done.done():  # the caller was cancelled meanwhile
            continue
        if exc is None:
            done.set_result(result)
        else:
            done.set_exception(exc)
