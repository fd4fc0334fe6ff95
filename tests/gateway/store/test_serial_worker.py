"""gateway/store/serial_worker.py: calls run in the order asked, off the loop, results and errors
come back to their callers, a cancelled caller's call still runs, close runs what is queued."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gateway.store.serial_worker import SerialWorker


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
