"""The batch queue's upkeep (gateway/http/batch_upkeep.py) on the local store's SQLite file, with no
worker running items: answered batches past their keep time are dropped (many, a bounded number a
store call), and the queue's depth (queued, running) reaches the metrics."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from gateway.http.batch_upkeep import expire_all, queue_upkeep
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from gateway.store import open_store
from gateway.store.queue import EXPIRED_PER_CALL, NewBatch


def batch(batch_id: str, n: int) -> NewBatch:
    return NewBatch(batch_id, "acme", "acct1", "key_1", "@cf/test/model", tuple(json.dumps({"prompt": "x"}) for _ in range(n)))


def sample(metrics: GatewayMetrics, state: str) -> float | None:
    return metrics.registry.get_sample_value("edgerun_gateway_batch_items", {"state": state})


async def test_expired_answers_are_dropped_and_the_depth_is_published_without_a_worker(tmp_path: Path) -> None:
    store = open_store(GatewaySettings(sqlite_path=str(tmp_path / "gateway.sqlite3")).store)
    q, metrics = store.queue, GatewayMetrics()
    try:
        num_answered = 2 * EXPIRED_PER_CALL + 3  # more than one store call's worth
        for b in range(num_answered):
            await q.enqueue(batch(f"done{b}", 1), max_queued=1000, max_bytes=1_000_000)
            item = await q.claim(30)
            assert item is not None and await q.complete(item, "answer", keep_s=0.2)
        assert await expire_all(q) == 0  # kept for now
        await asyncio.sleep(0.25)
        assert await q.expire() == EXPIRED_PER_CALL  # one call: a bounded number
        assert await expire_all(q) == num_answered - EXPIRED_PER_CALL  # then the rest, call after call
        assert all([await q.state("acme", f"done{b}") is None for b in range(num_answered)])

        await q.enqueue(batch("late", 1), max_queued=1000, max_bytes=1_000_000)
        item = await q.claim(30)
        assert item is not None and await q.complete(item, "answer", keep_s=0.1)
        await q.enqueue(batch("waiting", 3), max_queued=1000, max_bytes=1_000_000)
        running = await q.claim(30)
        assert running is not None and running.batch_id == "waiting"
        upkeep = asyncio.create_task(queue_upkeep(q, metrics, expire_every_s=0.1, depth_every_s=0.05))
        try:
            await asyncio.sleep(0.4)
            assert (sample(metrics, "queued"), sample(metrics, "running")) == (2, 1)
            assert await q.state("acme", "late") is None  # the upkeep dropped it: no worker runs here
            assert await q.state("acme", "waiting") is not None  # unanswered work stays
        finally:
            upkeep.cancel()
    finally:
        await store.aclose()
