"""The batch queue's upkeep (gateway/http/batch_upkeep.py) on the local store's SQLite file, with no
worker running items: answered batches past their keep time are dropped (many, a bounded number a
store call), and the queue's depth (queued, running) reaches the metrics."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from gateway.http.batch_upkeep import expire_all, queue_upkeep
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from gateway.store.local.queue import LocalQueue
from gateway.store.queue import EXPIRED_PER_CALL, NewBatch
from tests.clock import Clock


def batch(batch_id: str, n: int) -> NewBatch:
    return NewBatch(batch_id, "acme", "acct1", "key_1", "@cf/test/model", tuple(json.dumps({"prompt": "x"}) for _ in range(n)))


def sample(metrics: GatewayMetrics, state: str) -> float | None:
    return metrics.registry.get_sample_value("edgerun_gateway_batch_items", {"state": state})


async def settled(check: Callable[[], Awaitable[bool]], within_s: float = 10.0) -> bool:
    """Whether `check` comes true within `within_s` (the upkeep runs on its own timers)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_expired_answers_are_dropped_and_the_depth_is_published_without_a_worker(tmp_path: Path) -> None:
    # keep times run on a hand-moved clock: a loaded machine cannot expire an answer before the test looks
    clock = Clock()
    q = LocalQueue(GatewaySettings(sqlite_path=str(tmp_path / "gateway.sqlite3")).store, clock)
    metrics = GatewayMetrics()
    try:
        num_answered = 2 * EXPIRED_PER_CALL + 3  # more than one store call's worth
        for b in range(num_answered):
            await q.enqueue(batch(f"done{b}", 1), max_queued=1000, max_bytes=1_000_000)
            item = await q.claim(30)
            assert item is not None and await q.complete(item, "answer", keep_s=0.2)
        assert await expire_all(q) == 0  # kept for now
        clock.now += 0.25
        assert await q.expire() == EXPIRED_PER_CALL  # one call: a bounded number
        assert await expire_all(q) == num_answered - EXPIRED_PER_CALL  # then the rest, call after call
        assert all([await q.state("acme", f"done{b}") is None for b in range(num_answered)])

        await q.enqueue(batch("late", 1), max_queued=1000, max_bytes=1_000_000)
        item = await q.claim(30)
        assert item is not None and await q.complete(item, "answer", keep_s=0.1)
        await q.enqueue(batch("waiting", 3), max_queued=1000, max_bytes=1_000_000)
        running = await q.claim(30)
        assert running is not None and running.batch_id == "waiting"
        clock.now += 0.15
        upkeep = asyncio.create_task(queue_upkeep(q, metrics, expire_every_s=0.1, depth_every_s=0.05))
        try:
            async def published() -> bool:
                return (sample(metrics, "queued"), sample(metrics, "running")) == (2, 1)

            async def dropped() -> bool:
                return await q.state("acme", "late") is None

            assert await settled(published)
            assert await settled(dropped)  # the upkeep dropped it: no worker runs here
            assert await q.state("acme", "waiting") is not None  # unanswered work stays
        finally:
            upkeep.cancel()
    finally:
        await q.aclose()
