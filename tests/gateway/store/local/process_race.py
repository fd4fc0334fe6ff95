"""Four OS processes racing on one store: for one key's requests-per-minute (rpm 100), one tenant's
request slots (limit 50, all held until every process is done) and one month's budget (700 in
steps of 7), 60 tries each. Exact totals mean no limit exceeded and no write lost."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from multiprocessing.synchronize import Barrier
from typing import Any

from gateway.store import Store
from tests.gateway.store.calls import acquire_request_slot, reserve_budget

NUM_PROCESSES = 4
TRIES = 60  # per process, of each race


async def race(store: Store, index: int, barrier: Barrier) -> tuple[int, int, int]:
    """One process's part (in the child): how many of its tries were allowed in each race. Closes `store`."""
    try:
        await store.admission.budget_spent("acme", "2026-11")  # connected (or file open) before the start
        barrier.wait(60)  # all start together ...
        allowed = sum([(await store.admission.check_and_consume("key_a", 100, None, 0)).allowed for _ in range(TRIES)])
        slots = sum([await acquire_request_slot(store, "acme", f"p{index}-{i}", 50) for i in range(TRIES)])
        reserved = sum([(await reserve_budget(store, "acme", "2026-11", 7, 700)).allowed for _ in range(TRIES)])
        barrier.wait(60)  # ... and hold their slots until all are done
        return allowed, slots, reserved
    finally:
        await store.aclose()


def run_racers(child: Callable[..., None], where: Any) -> None:
    """Start NUM_PROCESSES `child(where, index, barrier, results)` (each puts `race`'s outcome in
    `results`) and check the totals."""
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[tuple[int, int, int]] = context.Queue()
    barrier = context.Barrier(NUM_PROCESSES)
    children = [context.Process(target=child, args=(where, i, barrier, results)) for i in range(NUM_PROCESSES)]
    for process in children:
        process.start()
    outcomes = [results.get(timeout=120) for _ in children]
    for process in children:
        process.join(timeout=30)
        assert process.exitcode == 0
    allowed, slots, reserved = (sum(column) for column in zip(*outcomes))
    assert allowed == 100  # rpm = 100 over 240 tries from 4 processes
    assert reserved == 100  # 700 / 7
    assert slots == 50  # all held until every process is done
