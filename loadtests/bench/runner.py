"""Drive sessions against the gateway at one load level.

Three ways to offer load (`Load.parse`):

- `concurrency:C` - closed loop: C clients, each runs one session to its end (turn after turn,
  no think time), then takes the next session.
- `rate:R` - open loop, Poisson: requests are sent at exponentially distributed intervals of
  mean 1/R. Each tick sends the oldest ready turn: the next turn of a session whose previous
  answer came back (sessions continue first), else the first turn of a new session while fewer
  than `max_active_sessions` are open. When nothing is ready the tick waits for the next answer,
  so the achieved rate (reported) can fall below R when the server is the bottleneck.
- `trace:S` - each session's requests start at its own arrival time x S (the trace's clock;
  S = 1 keeps the times the workload was built with).

A level stops dispatching after `max_duration_s` and waits for what is in flight. A session
whose request fails is abandoned, as a client would.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from loadtests.bench.client import RequestRecord
from loadtests.bench.workload import SessionPlan

# (session, request body) -> what the request measured and the reply text
TurnSender = Callable[[SessionPlan, dict[str, Any]], Awaitable[tuple[RequestRecord, str]]]
LoadMode = Literal["rate", "concurrency", "trace"]


@dataclass(frozen=True, slots=True)
class Load:
    mode: LoadMode
    value: float

    @classmethod
    def parse(cls, text: str) -> Load:
        mode, _, value = text.partition(":")
        if mode not in ("rate", "concurrency", "trace"):
            raise ValueError(f"load {text!r}: use rate:<requests/s>, concurrency:<clients> or trace:<time scale>")
        try:
            number = float(value)
        except ValueError:
            raise ValueError(f"load {text!r}: {value!r} is not a number") from None
        if number <= 0 or (mode == "concurrency" and not number.is_integer()):
            raise ValueError(f"load {text!r}: give a positive number (a whole one for concurrency)")
        return cls(mode, number)  # type: ignore[arg-type]

    @property
    def label(self) -> str:
        if self.mode == "rate":
            return f"rate {self.value:g}/s"
        if self.mode == "concurrency":
            return f"concurrency {self.value:g}"
        return f"trace x{self.value:g}"


async def run_load(plans: Sequence[SessionPlan], load: Load, send_turn: TurnSender, *, max_duration_s: float,
                   max_active_sessions: int = 8, seed: int = 0) -> list[RequestRecord]:
    records: list[RequestRecord] = []
    deadline = time.perf_counter() + max_duration_s
    if load.mode == "concurrency":
        await _closed_loop(plans, int(load.value), send_turn, records, deadline)
    elif load.mode == "rate":
        await _poisson(plans, load.value, send_turn, records, deadline, max_active_sessions, random.Random(seed))
    else:
        await _trace(plans, load.value, send_turn, records, deadline)
    return records


async def _run_session(plan: SessionPlan, send_turn: TurnSender, records: list[RequestRecord], deadline: float) -> None:
    body = plan.script.next_body(None)
    while body is not None and time.perf_counter() < deadline:
        record, reply = await send_turn(plan, body)
        records.append(record)
        if not record.ok:
            return
        body = plan.script.next_body(reply)


async def _closed_loop(plans: Sequence[SessionPlan], clients: int, send_turn: TurnSender,
                       records: list[RequestRecord], deadline: float) -> None:
    queue = deque(plans)

    async def client() -> None:
        while queue and time.perf_counter() < deadline:
            await _run_session(queue.popleft(), send_turn, records, deadline)

    await asyncio.gather(*(client() for _ in range(clients)))


async def _poisson(plans: Sequence[SessionPlan], rate: float, send_turn: TurnSender, records: list[RequestRecord],
                   deadline: float, max_active: int, rng: random.Random) -> None:
    fresh = deque(plans)
    ready: deque[tuple[SessionPlan, dict[str, Any]]] = deque()  # sessions whose next turn can go
    tasks: set[asyncio.Task[None]] = set()
    active = 0

    async def one_turn(plan: SessionPlan, body: dict[str, Any]) -> None:
        nonlocal active
        record, reply = await send_turn(plan, body)
        records.append(record)
        follow_up = plan.script.next_body(reply) if record.ok else None
        if follow_up is not None:
            ready.append((plan, follow_up))
        else:
            active -= 1

    next_at = time.perf_counter()
    while time.perf_counter() < deadline:
        next_at += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        while not ready and not (fresh and active < max_active):
            if active == 0 and not fresh:
                break
            await asyncio.sleep(0.01)  # nothing to send until an answer comes back
            next_at = max(next_at, time.perf_counter())
        if ready:
            plan, body = ready.popleft()
        elif fresh and active < max_active:
            plan = fresh.popleft()
            first = plan.script.next_body(None)
            if first is None:
                continue
            body = first
            active += 1
        else:
            break  # every session is over
        if time.perf_counter() >= deadline:
            break
        task = asyncio.create_task(one_turn(plan, body))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


async def _trace(plans: Sequence[SessionPlan], time_scale: float, send_turn: TurnSender,
                 records: list[RequestRecord], deadline: float) -> None:
    start = time.perf_counter()

    async def at_arrival(plan: SessionPlan) -> None:
        delay = start + plan.arrival_s * time_scale - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if time.perf_counter() < deadline:
            await _run_session(plan, send_turn, records, deadline)

    await asyncio.gather(*(at_arrival(plan) for plan in plans))
