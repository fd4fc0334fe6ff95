"""One thread that runs blocking calls (SQLite) in the order they were asked for, off the event loop.

What `ThreadPoolExecutor(max_workers=1)` + `run_in_executor` does, with the hand-offs batched:
calls asked for while the thread is busy run one after another in its next wake-up, and their
results go back to the loop in one callback. Under load (many requests each making a few store
calls) that is one thread wake-up and one loop wake-up for many calls instead of two per call.
The calls travel through a `queue.SimpleQueue` (C: a put wakes the thread only when it waits, with
none of `threading.Condition`'s Python steps on either side).
A call whose caller was cancelled still runs (as in an executor once queued): the store's writes
are never half-done.

Group commit (`run_grouped`, once the worker has a `commit`: given at construction, or set before the
first grouped call as the shared store does once its tables are open): consecutive grouped calls of
one wake-up (at most `MAX_GROUP`) share one open write transaction, which `commit` ends after the
last of them; their results reach their callers only once that commit has succeeded (if it fails,
each of them gets its error). A plain call between them commits the group first, so it never
waits for a lock this thread holds. The local store's shared mode (shared_tables.py) uses this to take
the file's write lock once per wake-up instead of once per call.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_Job = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]", bool]
_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]
MAX_GROUP = 128  # grouped calls per transaction: bounds how long one worker holds the write lock


class SerialWorker:
    def __init__(self, name: str, commit: Callable[[], None] | None = None) -> None:
        """`commit` ends the transaction grouped calls left open (see `run_grouped`); None: no grouping."""
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()  # None: close
        self._closing = threading.Lock()  # no call is queued after the None
        self._closed = False
        self._outstanding = 0  # calls asked for whose outcome has not reached the loop yet (see is_idle)
        self.commit = commit
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the worker thread, after every call asked for before it."""
        return await self._ask(fn, args, grouped=False)

    async def run_grouped(self, fn: Callable[..., T], *args: Any) -> T:
        """As `run`, for a call that may join the open group transaction; it returns once that is committed."""
        return await self._ask(fn, args, grouped=self.commit is not None)

    @property
    def is_idle(self) -> bool:
        """True when every call asked for has run and its outcome has reached the loop: a call made
        now on the loop's own thread overtakes none of them. Read it on the thread of the one event
        loop that asks this worker for calls (the counts are kept there)."""
        return self._outstanding == 0 and not self._closed

    async def _ask(self, fn: Callable[..., T], args: tuple[Any, ...], grouped: bool) -> T:
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        with self._closing:
            if self._closed:
                raise RuntimeError("the store's worker thread is closed")
            self._jobs.put((fn, args, done, grouped))
            self._outstanding += 1  # back down when its outcome reaches the loop, cancelled caller or not
        return await done

    def close(self) -> None:
        """Run what is queued, then stop the thread (and wait for it)."""
        with self._closing:
            if not self._closed:
                self._closed = True
                self._jobs.put(None)
        self._thread.join()

    def _work(self) -> None:
        is_closed = False
        while not is_closed:
            jobs: list[_Job] = []
            job = self._jobs.get()  # waits for the first call; then takes what else is queued
            while True:
                if job is None:
                    is_closed = True  # nothing comes after it
                    break
                jobs.append(job)
                try:
                    job = self._jobs.get_nowait()
                except queue.Empty:
                    break
            self._run_jobs(jobs)

    def _run_jobs(self, jobs: list[_Job]) -> None:
        """One wake-up's calls in order, grouped calls committed together, results handed back at once."""
        settled: list[_Outcome] = []
        group: list[_Outcome] = []  # outcomes waiting for the group's commit
        for fn, args, done, grouped in jobs:
            if group and (not grouped or len(group) >= MAX_GROUP):
                settled.extend(self._commit(group))
                group = []
            try:
                outcome: _Outcome = (done, fn(*args), None)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome = (done, None, exc)
            (group if grouped else settled).append(outcome)
        settled.extend(self._commit(group))
        self._hand_back(settled)

    def _commit(self, group: list[_Outcome]) -> list[_Outcome]:
        """The group's outcomes once its transaction is committed; if the commit fails, its error for each."""
        if not group or self.commit is None:
            return group
        try:
            self.commit()
        except BaseException as exc:  # noqa: BLE001 - nothing of the group was written
            return [(done, None, error or exc) for done, _, error in group]
        return group

    def _hand_back(self, settled: list[_Outcome]) -> None:
        outcomes: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
        for outcome in settled:
            outcomes.setdefault(outcome[0].get_loop(), []).append(outcome)
        for loop, some in outcomes.items():
            try:
                loop.call_soon_threadsafe(self._settle, some)
            except RuntimeError:  # that loop is closed: nobody waits for these any more
                pass

    def _settle(self, outcomes: list[_Outcome]) -> None:
        self._outstanding -= len(outcomes)
        _settle(outcomes)


def _settle(outcomes: list[_Outcome]) -> None:
    for done, result, exc in outcomes:
        if done.done():  # the caller was cancelled meanwhile
            continue
        if exc is None:
            done.set_result(result)
        else:
            done.set_exception(exc)
