"""gateway.pipeline.holds: every hold a request takes is released exactly once, the ledger last."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from contracts.usage import Usage
from gateway.pipeline.holds import Holds, Outcome, run_to_end
from gateway.store.errors import StoreUnavailable

OK = Outcome(Usage(3, 2, 0), "ok", "b1", "local", streamed=True)


async def test_settle_releases_each_hold_once_in_order_with_the_ledger_last() -> None:
    holds, released = Holds("r1"), []

    def hold(name: str):  # type: ignore[no-untyped-def]
        async def release(outcome: Outcome) -> None:
            released.append((name, outcome.status))

        return release

    holds.push("concurrency", hold("concurrency"))
    holds.push("budget", hold("budget"), final=True)
    holds.push("tokens", hold("tokens"))
    holds.push("route", hold("route"))
    assert await holds.settle(OK) is True
    assert await holds.settle(Outcome(Usage(0, 0, 0), "cancelled")) is False  # the second settle does nothing
    assert released == [("concurrency", "ok"), ("tokens", "ok"), ("route", "ok"), ("budget", "ok")]
    assert holds.outcome == OK


async def test_a_failing_release_does_not_keep_the_others() -> None:
    holds, released = Holds("r2"), []

    async def outage(_: Outcome) -> None:
        raise StoreUnavailable("the store is down")

    async def bug(_: Outcome) -> None:
        raise RuntimeError("a bug")

    async def slot(_: Outcome) -> None:
        released.append("slot")

    holds.push("route", outage)
    holds.push("tokens", bug)
    holds.push("concurrency", slot)
    await holds.settle(OK)
    assert released == ["slot"]


def slow_then_ledger(request_id: str) -> tuple[Holds, list[str]]:
    """Holds whose first release waits 50 ms and whose ledger record comes last; `released` fills in."""
    holds, released = Holds(request_id), []

    async def slow(_: Outcome) -> None:
        await asyncio.sleep(0.05)
        released.append("slow")

    async def ledger(_: Outcome) -> None:
        released.append("ledger")

    holds.push("slow", slow)
    holds.push("ledger", ledger, final=True)
    return holds, released


async def test_settle_finishes_even_when_its_scope_is_cancelled() -> None:
    holds, released = slow_then_ledger("r3")
    async with anyio.create_task_group() as group:  # an anyio cancel scope, as Starlette's task groups cancel
        group.start_soon(holds.settle, OK)
        await asyncio.sleep(0.01)
        group.cancel_scope.cancel()
    assert released == ["slow", "ledger"]


async def test_settle_finishes_even_when_its_task_is_cancelled() -> None:
    """Task.cancel() (a client that left, a request cut at shutdown) passes anyio's shields: the
    releases still all run, the ledger's last, and the cancellation reaches the caller afterwards."""
    holds, released = slow_then_ledger("r5")
    settling = asyncio.ensure_future(holds.settle(OK))
    await asyncio.sleep(0.01)
    settling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await settling
    assert released == ["slow", "ledger"]


async def test_run_to_end_within_run_to_end_runs_in_the_same_task() -> None:
    ran: list[tuple[str, asyncio.Task[object] | None]] = []

    async def inner() -> int:
        await asyncio.sleep(0.05)
        ran.append(("inner", asyncio.current_task()))
        return 2

    async def outer() -> int:
        ran.append(("outer", asyncio.current_task()))
        return await run_to_end(inner())

    caller = asyncio.ensure_future(run_to_end(outer()))
    await asyncio.sleep(0.01)
    caller.cancel()  # neither the outer nor the inner work stops for it
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert [name for name, _ in ran] == ["outer", "inner"]
    assert ran[0][1] is ran[1][1] is not caller
    assert await run_to_end(outer()) == 2


def test_no_hold_is_taken_after_settling() -> None:
    holds = Holds("r4")
    asyncio.run(holds.settle(OK))

    async def late(_: Outcome) -> None:
        pass

    with pytest.raises(AssertionError, match="after r4 was settled"):
        holds.push("late", late)
