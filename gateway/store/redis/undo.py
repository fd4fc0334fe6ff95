"""`ReservationUndo`: takes back the Redis budget reservations whose caller never learnt whether they applied.

An `admit` that reserves budget and times out or loses its connection (Redis paused, slow, a network fault)
fails with StoreUnavailable: the request gets 503 and nothing settles it. But Redis may still run the
script later (it was only slow), and the worst case would then stay in the month's spend for good,
refusing the tenant early. Redis sends no late answer to notice it by, so each call carries a token
(`ADMIT` marks it with the amount when it applies) and, when the call fails this way, the
token is queued here. One background task owned by the store runs `UNDO_RESERVATIONS` over the queue
until Redis answers: an applied reservation is taken back, and a token not seen yet is marked 'undone'
so that a reservation still on its way applies nothing. Both orders end at the spend held before.

Bounded: tries with backoff (up to `max_delay_s` apart) for `give_up_after_s`, at most `max_pending`
tokens queued; past them a reservation may stay counted (over-charged, never under), logged. A
successful reservation costs nothing here: its token key just expires.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field

import structlog
from redis.exceptions import RedisError

log = structlog.get_logger("edgerun.gateway.store")


@dataclass(eq=False, slots=True)
class ReservationUndo:
    undo: Callable[[list[str]], Awaitable[object]]  # runs UNDO_RESERVATIONS over (spend counter, token key) pairs, flattened
    _: KW_ONLY
    first_delay_s: float = 0.05
    max_delay_s: float = 5.0
    give_up_after_s: float = 60.0
    max_pending: int = 10_000
    batch: int = 200
    clock: Callable[[], float] = time.monotonic
    # token key -> (spend counter, queued at)
    _pending: dict[str, tuple[str, float]] = field(default_factory=dict, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _closed: bool = field(default=False, init=False, repr=False)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, spend_key: str, token_key: str) -> None:
        """Queue a reservation to take back (or to stop before it lands); starts the task if idle."""
        if self._closed:
            log.warning("a reservation of unknown fate stays counted: the store is closing", token=token_key)
            return
        if len(self._pending) >= self.max_pending:
            log.warning("a reservation of unknown fate stays counted: too many queued", token=token_key)
            return
        self._pending[token_key] = (spend_key, self.clock())
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="edgerun-budget-undo")

    async def _run(self) -> None:
        delay = self.first_delay_s
        while self._pending:
            await asyncio.sleep(delay)
            batch = list(self._pending.items())[: self.batch]
            try:
                await self.undo([key for token, (spend, _) in batch for key in (spend, token)])
            except RedisError as exc:
                delay = min(delay * 2, self.max_delay_s)
                self._drop_expired(exc)
                continue
            for token, _ in batch:
                self._pending.pop(token, None)
            delay = self.first_delay_s

    def _drop_expired(self, exc: RedisError) -> None:
        oldest = self.clock() - self.give_up_after_s
        expired = [token for token, (_, queued) in self._pending.items() if queued < oldest]
        for token in expired:
            del self._pending[token]
        if expired:
            log.warning("reservations of unknown fate stay counted: Redis did not answer in time",
                        count=len(expired), error=repr(exc))

    async def aclose(self, wait_s: float) -> None:
        """Give the queue `wait_s` to drain (the store still answers), then stop."""
        self._closed = True
        task = self._task
        if task is None:
            return
        if not task.done():
            await asyncio.wait({task}, timeout=wait_s)
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if self._pending:
            log.warning("reservations of unknown fate stay counted: the store closed first", count=len(self._pending))
