"""`queue_upkeep`: the batch queue's housekeeping, on every gateway whether or not it runs items
(`batch_concurrency` 0 included), as an asyncio task owned by the app's lifespan (`Services.start`).

Every `expire_every_s` it drops the answered batches past their keep time (`BatchQueue.expire`, a
bounded number a call, called again while a call drops a full count: the local queue's answers
would otherwise stay in the SQLite file on a gateway that runs no items); every `depth_every_s` it
sets the queue's depth (queued, running items of every tenant) on /metrics, so a scrape never
reads the queue.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from gateway.metrics import GatewayMetrics
from gateway.store.errors import StoreUnavailable
from gateway.store.queue import EXPIRED_PER_CALL, BatchQueue

log = structlog.get_logger("edgerun.gateway.batch")

EXPIRE_EVERY_S = 60.0  # how often answered batches past their keep time are dropped (the local queue)
DEPTH_EVERY_S = 5.0  # how often the queue's depth is read for /metrics


async def expire_all(queue: BatchQueue) -> int:
    """Every answered batch past its keep time dropped, a bounded number per store call; how many."""
    dropped = 0
    while (step := await queue.expire()) > 0:
        dropped += step
        if step < EXPIRED_PER_CALL:
            break
        await asyncio.sleep(0)  # other tasks go between two calls
    return dropped


async def queue_upkeep(queue: BatchQueue, metrics: GatewayMetrics, expire_every_s: float = EXPIRE_EVERY_S,
                       depth_every_s: float = DEPTH_EVERY_S) -> None:
    next_expiry = 0.0
    while True:
        try:
            if time.monotonic() >= next_expiry:
                next_expiry = time.monotonic() + expire_every_s
                await expire_all(queue)
            queued, running = await queue.depth()
            metrics.batch_items.labels("queued").set(queued)
            metrics.batch_items.labels("running").set(running)
        except StoreUnavailable as exc:
            log.warning("the batch queue cannot be read", error=str(exc))
        except Exception:  # a bug must not stop the upkeep for good: say it, and go on
            log.exception("the batch queue's upkeep failed")
        await asyncio.sleep(depth_every_s)
