from __future__ import annotations

import asyncio

import pytest

from backends.server.admission import Admission, Phase
from backends.server.errors import Overloaded, Unavailable


def test_refuses_until_ready_then_bounds_in_flight() -> None:
    admission = Admission(max_in_flight=2)
    with pytest.raises(Unavailable, match="loading"):
        admission.admit("a")
    admission.mark_ready()
    admission.admit("a")
    admission.admit("b")
    with pytest.raises(Overloaded, match="2 requests"):
        admission.admit("c")
    admission.release("a")
    admission.admit("c")
    assert admission.num_active == 2


async def test_drain_refuses_new_waits_and_returns_leftovers() -> None:
    admission = Admission(max_in_flight=4)
    admission.mark_ready()
    admission.admit("quick")
    admission.admit("slow")
    asyncio.get_running_loop().call_later(0.05, admission.release, "quick")
    left = await admission.drain(timeout_s=0.3)
    assert left == ["slow"]
    assert admission.phase is Phase.DRAINING
    with pytest.raises(Unavailable, match="shutting down"):
        admission.admit("late")


async def test_drain_returns_early_when_idle() -> None:
    admission = Admission(max_in_flight=1)
    admission.mark_ready()
    admission.admit("a")
    asyncio.get_running_loop().call_later(0.05, admission.release, "a")
    started = asyncio.get_running_loop().time()
    assert await admission.drain(timeout_s=10) == []
    assert asyncio.get_running_loop().time() - started < 5


def test_a_request_that_may_not_queue_is_refused_once_the_running_batch_is_full() -> None:
    """The gateway's x-edgerun-reject-if-busy (a client's options.rejectIfBusy): 429 rather than a place in the queue."""
    admission = Admission(max_in_flight=3, max_running=1)
    admission.mark_ready()
    admission.admit("running", may_queue=False)  # the batch has room: it runs at once
    with pytest.raises(Overloaded, match="busy"):
        admission.admit("impatient", may_queue=False)
    assert not admission.is_active("impatient")
    admission.admit("patient")  # may queue: waits in the engine's queue
    admission.release("running")
    with pytest.raises(Overloaded, match="busy"):  # the patient one takes the batch's place
        admission.admit("impatient", may_queue=False)
    admission.release("patient")
    admission.admit("impatient", may_queue=False)
