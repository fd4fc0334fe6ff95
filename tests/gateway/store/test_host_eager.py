"""eager.py: a coroutine run on the spot, and driven on from the loop (no task) when it waits."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.store.host.eager import run_eagerly


class _Outcome:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, BaseException | None]] = []
        self.seen = asyncio.Event()

    def __call__(self, result: Any, error: BaseException | None) -> None:
        self.calls.append((result, error))
        self.seen.set()


async def test_a_call_that_never_waits_is_answered_before_run_eagerly_returns() -> None:
    async def add(a: int, b: int) -> int:
        return a + b

    outcome = _Outcome()
    assert run_eagerly(add(2, 3), outcome) is True
    assert outcome.calls == [(5, None)]


async def test_a_call_that_waits_goes_on_without_a_task() -> None:
    tasks_before = asyncio.all_tasks()
    answer: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    seen_task: list[object] = []

    async def slow() -> int:
        await asyncio.sleep(0)  # a bare yield
        value = await answer  # a future
        seen_task.append(asyncio.current_task())
        return value * 2

    outcome = _Outcome()
    assert run_eagerly(slow(), outcome) is False
    assert outcome.calls == [] and asyncio.all_tasks() == tasks_before
    await asyncio.sleep(0)
    answer.set_result(21)
    await asyncio.wait_for(outcome.seen.wait(), 5)
    assert outcome.calls == [(42, None)] and seen_task == [None]


async def test_errors_reach_done_also_after_waiting() -> None:
    loop = asyncio.get_running_loop()
    failing: asyncio.Future[int] = loop.create_future()
    cancelled: asyncio.Future[int] = loop.create_future()

    async def wait_for(future: asyncio.Future[int]) -> int:
        return await future

    at_once, later, gone = _Outcome(), _Outcome(), _Outcome()
    assert run_eagerly(_raise(), at_once)
    assert isinstance(at_once.calls[0][1], ValueError)
    assert not run_eagerly(wait_for(failing), later)
    assert not run_eagerly(wait_for(cancelled), gone)
    failing.set_exception(KeyError("k"))
    cancelled.cancel()
    await asyncio.wait_for(asyncio.gather(later.seen.wait(), gone.seen.wait()), 5)
    assert isinstance(later.calls[0][1], KeyError)
    assert isinstance(gone.calls[0][1], asyncio.CancelledError)  # answered, not lost


async def _raise() -> None:
    raise ValueError("bad")
