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
