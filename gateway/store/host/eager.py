"""Run a coroutine at once, on the caller's stack, and make a task of it only if it suspends.

Most store calls on the host (limits, slots, in-flight tokens, sessions, the prefix index) finish
without awaiting anything: running them directly (`coro.send(None)` raising StopIteration with the
result) saves a task, two loop turns and a callback per call. A call that does wait (SQLite work
on the store's thread) goes on in a task from where it stopped (`finish_in_task`), as if it had
been a task from the start.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Generator
from typing import Any

Done = Callable[[Any, BaseException | None], None]


def run_eagerly(coro: Coroutine[Any, Any, Any], done: Done) -> asyncio.Task[Any] | None:
    """Run `coro` until it finishes or suspends. Finished: `done(result, None)` or `done(None, error)`
    is called before this returns None. Suspended: the task that finishes it (calling `done` then)."""
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        done(stop.value, None)
        return None
    except Exception as exc:  # noqa: BLE001 - it goes back to the caller as the call's error
        done(None, exc)
        return None
    return finish_in_task(coro, yielded, done)


def finish_in_task(coro: Coroutine[Any, Any, Any], yielded: Any, done: Done) -> asyncio.Task[Any]:
    """A task that drives `coro` on from where `coro.send(None)` returned `yielded`, then calls `done`."""
    return asyncio.get_running_loop().create_task(_finish(coro, yielded, done))


async def _finish(coro: Coroutine[Any, Any, Any], yielded: Any, done: Done) -> None:
    try:
        result = await _Resume(coro, yielded)
    except Exception as exc:  # noqa: BLE001 - the call's error, as above
        done(None, exc)
    else:
        done(result, None)


class _Resume:
    """Awaiting it hands the task what `coro` yielded (a future to wait for) and then drives `coro` on."""

    def __init__(self, coro: Coroutine[Any, Any, Any], yielded: Any) -> None:
        self._coro = coro
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, yielded = self._coro, self._yielded
        while True:
            try:
                sent = yield yielded
            except BaseException as exc:  # the task was cancelled: pass it in
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
