"""What one request holds until it is settled: each hold is pushed as it is taken, and one
`settle` releases all of them exactly once, on every path (answered, client gone, backend
failed before or after its first byte, failed over, refused during set-up).

Holds are released in the order they were taken, except the `final` ones (the request's ticket,
given back in one store call with its ledger record: gateway/pipeline/ticket.py), which come last:
whoever sees a request's record sees every other hold already released. A release that fails is
logged and does not stop the others (a store outage leaves the slot and in-flight tokens to their
lease, and the record to the spool).

Settling runs to its end even when the task awaiting it is cancelled (`run_to_end`): a client
that leaves, uvicorn cutting a request at shutdown, or `collect_or_cancel` all cancel with
`Task.cancel()`, which anyio's shielded scopes do not stop, and a cancellation landing inside a
release would otherwise lose the ledger record.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from contracts.usage import Usage
from gateway.store.errors import StoreUnavailable
from gateway.store.models import UsageStatus

log = structlog.get_logger("edgerun.gateway.holds")


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a request ended, as every release needs it."""

    usage: Usage
    status: UsageStatus
    backend_id: str | None = None  # the backend that answered, or the one that failed it; None: none reached
    region: str | None = None
    streamed: bool = False  # a backend stream was opened (its tokens count against the key's tpm)


Release = Callable[[Outcome], Awaitable[None]]
T = TypeVar("T")


_RUNNING_TO_END: ContextVar[bool] = ContextVar("edgerun_running_to_end", default=False)


async def run_to_end(work: Coroutine[Any, Any, T]) -> T:
    """`work`'s result, with `work` run to its end in a task of its own even if the caller is
    cancelled meanwhile (a cancellation that came is raised afterwards, so the caller still ends).
    Called from such a task already (a generation's settling settles its holds), it just awaits."""
    if _RUNNING_TO_END.get():
        return await work
    task = asyncio.get_running_loop().create_task(_running_to_end(work))
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:  # the caller's (wait on), or the work's own (then it is done)
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


async def _running_to_end(work: Coroutine[Any, Any, T]) -> T:
    _RUNNING_TO_END.set(True)  # this task's own context (and that of the tasks it starts)
    return await work


class Holds:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._holds: list[tuple[str, Release, bool]] = []
        self.outcome: Outcome | None = None  # set by the one settle

    def push(self, name: str, release: Release, *, final: bool = False) -> None:
        assert self.outcome is None, f"{name} taken after {self.request_id} was settled"
        self._holds.append((name, release, final))

    async def settle(self, outcome: Outcome) -> bool:
        """Release every hold with `outcome`; False (and nothing done) when already settled."""
        if self.outcome is not None:
            return False
        self.outcome = outcome
        await run_to_end(self._release_all(outcome))
        return True

    async def _release_all(self, outcome: Outcome) -> None:
        ordered = [h for h in self._holds if not h[2]] + [h for h in self._holds if h[2]]
        for name, release, _ in ordered:
            try:
                await release(outcome)
            except StoreUnavailable as exc:  # an outage: leases and the backends' /load correct the counts
                log.warning("releasing a hold failed", hold=name, error=exc.args[0], request_id=self.request_id)
            except Exception:
                log.exception("releasing a hold failed", hold=name, request_id=self.request_id)
