"""gateway/pipeline/setup_gate.py: at most `concurrency` places held, waiters served in arrival order,
a place given back early (`leave`) or at the end of its block, exactly once."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import BUSY_MESSAGE, OutOfCapacity
from gateway.pipeline.setup_gate import SetupGate


async def has_room(gate: SetupGate) -> bool:
    """Whether one more request enters the gate now, without waiting (it leaves again at once)."""
    try:
        async with gate.enter(may_wait=False):
            return True
    except OutOfCapacity:
        return False


async def test_waiters_enter_in_arrival_order_once_a_place_is_left() -> None:
    gate = SetupGate(2)
    entered: list[int] = []
    release = asyncio.Event()

    async def request(i: int) -> None:
        async with gate.enter() as place:
            entered.append(i)
            await release.wait()
            place.leave()
            place.leave()  # a second leave gives nothing back twice
            await asyncio.sleep(0)

    tasks = [asyncio.create_task(request(i)) for i in range(5)]
    await asyncio.sleep(0.01)
    assert entered == [0, 1] and not await has_room(gate)
    release.set()
    await asyncio.gather(*tasks)
    assert entered == [0, 1, 2, 3, 4]
    assert await has_room(gate)


async def test_a_failed_setup_gives_its_place_back() -> None:
    gate = SetupGate(1)
    try:
        async with gate.enter():
            raise ValueError("tokenizing failed")
    except ValueError:
        pass
    assert await has_room(gate)
    async with asyncio.timeout(1):
        async with gate.enter():
            assert not await has_room(gate)


async def test_a_request_that_may_not_wait_is_answered_busy_at_once() -> None:
    """options.rejectIfBusy: 429 / 3040 instead of a wait for a place (also behind others waiting)."""
    gate = SetupGate(1)
    async with gate.enter():
        with pytest.raises(OutOfCapacity) as caught:
            async with gate.enter(may_wait=False):
                pass
        assert caught.value.message == BUSY_MESSAGE
    async with asyncio.timeout(1):
        async with gate.enter(may_wait=False):  # a free place: entered at once
            assert not await has_room(gate)
    assert await has_room(gate)
