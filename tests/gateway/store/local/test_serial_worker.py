"""gateway/store/serial_worker.py: calls run in the order asked, off the loop, results and errors
come back to their callers, a cancelled caller's call still runs, close runs what is queued."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import pytest

from gateway.store.local.serial_worker import SerialWorker


async def test_calls_run_in_order_on_the_worker_thread_and_return_their_results() -> None:
    worker = SerialWorker("test-serial")
    seen: list[tuple[int, str]] = []

    def job(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        time.sleep(0.001)
        return i * i

    try:
        results = await asyncio.gather(*(worker.run(job, i) for i in range(50)))
        assert results == [i * i for i in range(50)]
        assert [i for i, _ in seen] == list(range(50))
        assert {name for _, name in seen} == {"test-serial"}
    finally:
        worker.close()


async def test_an_error_goes_to_its_caller_only() -> None:
    worker = SerialWorker("test-serial")

    def fails() -> None:
        raise ValueError("bad")

    try:
        outcomes = await asyncio.gather(worker.run(int, "1"), worker.run(fails), worker.run(int, "2"),
                                        return_exceptions=True)
        assert outcomes[0] == 1 and outcomes[2] == 2
        assert isinstance(outcomes[1], ValueError)
    finally:
        worker.close()


async def test_a_cancelled_callers_call_still_runs_and_close_runs_what_is_queued() -> None:
    worker = SerialWorker("test-serial")
    ran: list[str] = []
    gate = threading.Event()
    blocker = asyncio.ensure_future(worker.run(gate.wait, 5))
    await asyncio.sleep(0.05)
    cancelled = asyncio.ensure_future(worker.run(ran.append, "cancelled"))
    queued = asyncio.ensure_future(worker.run(ran.append, "queued"))
    await asyncio.sleep(0)
    cancelled.cancel()
    gate.set()
    await asyncio.gather(blocker, queued)
    assert ran == ["cancelled", "queued"]
    worker.close()
    with pytest.raises(RuntimeError, match="closed"):
        await worker.run(int, "3")


def each_thread_on_its_loop(num_threads: int, calls: Callable[[int], Awaitable[None]]) -> list[BaseException]:
    """`calls(t)` on its own event loop in each of `num_threads` threads at once; what they raised."""
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            asyncio.run(calls(t))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(num_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def test_calls_from_many_loops_at_once_keep_their_order_and_none_waits_for_good() -> None:
    # Many puts race the worker emptying the queue and going back to wait: a lost wake-up would leave a
    # call queued with the thread asleep (its caller's wait_for fails). Each loop's calls run in the
    # order asked, bursts included, and each caller gets its own result.
    worker = SerialWorker("test-serial")
    ran: dict[int, list[int]] = {t: [] for t in range(4)}

    def record(t: int, n: int) -> int:
        ran[t].append(n)
        return n

    async def calls(t: int) -> None:
        n = 0
        for burst in range(400):
            asked = list(range(n, n + 1 + burst % 4))
            n += len(asked)
            got = await asyncio.wait_for(asyncio.gather(*(worker.run(record, t, i) for i in asked)), 30)
            assert got == asked

    assert each_thread_on_its_loop(4, calls) == []
    worker.close()
    for t in range(4):
        assert ran[t] == list(range(len(ran[t]))) and len(ran[t]) == sum(1 + b % 4 for b in range(400))


def test_close_racing_calls_from_other_loops_runs_or_refuses_each_call() -> None:
    # Every call asked before close runs and answers its caller; every later one is refused; none hangs.
    worker = SerialWorker("test-serial")
    answered: list[int] = []
    refused = threading.Event()

    async def calls(t: int) -> None:
        for i in range(100_000):
            try:
                answered.append(await asyncio.wait_for(worker.run(int, i), 30))
            except RuntimeError:
                refused.set()
                return

    closer = threading.Timer(0.2, worker.close)
    closer.start()
    assert each_thread_on_its_loop(3, calls) == []
    closer.join()
    assert refused.is_set() and answered
