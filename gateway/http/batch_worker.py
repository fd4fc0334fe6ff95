"""`BatchWorker`: runs queued batch items (gateway/pipeline/batch.py) on this process's spare capacity.

Owned by the app's lifespan (`Services.start` / `aclose`). It claims an item from the store's queue
(gateway/store/queue.py) only while it runs fewer than `batch_concurrency` and this process's open
backend requests are under `batch_connection_share` of `backend_max_connections`. When the queue has
nothing ready it waits for an enqueue to wake it (`BatchQueue.wait_for_work`), or for the first item
it gave back to come due, looking at the queue at least every `batch_idle_poll_s` (for leases that
lapsed elsewhere): an idle gateway makes next to no store calls, and a new item starts at once.
Each item runs as its synchronous request would, through the same generation (or embedding)
service, as the key that queued it, with `rejectIfBusy`: where an interactive request would wait for capacity (the tenant's
slots, the setup gate, every backend busy), the item is given back for later instead
(`release`), so batch work never queues behind interactive traffic, and a queued batch is answered
eventually rather than refused.

Exactly once: the item's lease is renewed every third of `batch_lease_s` while it runs; a worker
that dies leaves it to be claimed again when the lease ends. Its ledger record is keyed by the
item's request id, the same on such a retry, so an item whose record was written before the crash
is billed once (the ledger writes one record per request id); the first answer stored wins. An item
whose claims lapsed `batch_max_attempts` times (it crashes its worker?) is answered with an error.
Its running items count as requests in flight for the graceful drain (gateway/http/drain.py): on
SIGTERM it claims nothing more and the drain waits for them, within the one `shutdown_timeout_s`;
what is still running after it is cancelled (billed, like any cancelled request, for what was
generated) and given back, to run again under a new request id. Each run's outcome is counted on
/metrics (`batch_item_runs`); dropping expired answers and the queue's depth are the upkeep's
(gateway/http/batch_upkeep.py), which runs on gateways that run no items too.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import time
from typing import Any

import structlog

from backends.client import BackendClient
from gateway.context import Principal, RequestContext
from gateway.errors import (
    AuthenticationFailed,
    BudgetExhausted,
    ConcurrencyLimited,
    GatewayError,
    InternalError,
    OutOfCapacity,
    RateLimited,
    ServiceUnavailable,
)
from gateway.fleet.catalog import EMBEDDING_TASK, Catalog
from gateway.http import envelopes
from gateway.http.drain import Drain
from gateway.http.render import workers_ai_result
from gateway.metrics import GatewayMetrics
from gateway.pipeline.auth import Authenticator
from gateway.pipeline.batch import Item, answered, failed, generation_input
from gateway.pipeline.embedding import Embedder
from gateway.pipeline.embedding_input import parse_workers_ai_embedding
from gateway.pipeline.generation import Generator
from gateway.pipeline.settings import BatchSettings
from gateway.store.errors import StoreUnavailable
from gateway.store.queue import BatchQueue, ClaimedItem
from gateway.store.tenancy import Tenancy

log = structlog.get_logger("edgerun.gateway.batch")

MAX_RETRY_S = 10.0  # the longest a busy item waits before it may be claimed again
PAUSE_WHEN_BUSY_S = 0.2  # after a refusal, the worker claims nothing for this long


class Busy(Exception):
    """The item could not start now (no spare capacity); it is given back for later."""

    def __init__(self, retry_in_s: float) -> None:
        super().__init__(retry_in_s)
        self.retry_in_s = retry_in_s


def is_busy(exc: BaseException) -> bool:
    """A refusal that passes with time: the item is tried again rather than answered with it."""
    if isinstance(exc, BudgetExhausted):
        return False
    return isinstance(exc, RateLimited | OutOfCapacity | ConcurrencyLimited | ServiceUnavailable | StoreUnavailable)


class BatchWorker:
    def __init__(
        self,
        queue: BatchQueue,
        tenancy: Tenancy,
        catalog: Catalog,
        auth: Authenticator,
        generator: Generator,
        embedder: Embedder,
        client: BackendClient,
        settings: BatchSettings,
        metrics: GatewayMetrics,
        drain: Drain | None = None,
    ) -> None:
        self.queue = queue
        self.metrics = metrics
        self.drain = drain  # the app's graceful drain: items count as in flight, none starts once it runs
        self.tenancy = tenancy
        self.catalog = catalog
        self.auth = auth
        self.generator = generator
        self.embedder = embedder
        self.client = client
        self.settings = settings
        self._running: dict[asyncio.Task[None], ClaimedItem] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._quiet_until = 0.0
        self._given_back: list[float] = []  # a heap: when the items this worker gave back for later come due

    def start(self) -> None:
        if self.settings.batch_concurrency > 0 and self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._claim_forever(), name="batch-worker")

    async def aclose(self) -> None:
        """Stop claiming; cancel the items still running and give them back (see the module's doc)."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        running = dict(self._running)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for item in running.values():
            with contextlib.suppress(StoreUnavailable):
                await self.queue.release(item, 0.0)

    def has_room(self) -> bool:
        """Whether one more item may start now: below its own concurrency and the connection share."""
        s = self.settings
        if len(self._running) >= s.batch_concurrency or time.monotonic() < self._quiet_until:
            return False
        if self.drain is not None and self.drain.is_draining:
            return False
        return self.client.open_requests < self.client.max_connections * s.batch_connection_share

    async def _claim_forever(self) -> None:
        s = self.settings
        while True:
            if not self.has_room():  # room comes back with time: no store call meanwhile
                await asyncio.sleep(s.batch_poll_interval_s)
                continue
            try:
                item = await self.queue.claim(s.batch_lease_s)
            except StoreUnavailable as exc:
                log.warning("the batch queue cannot be read", error=str(exc))
                await asyncio.sleep(s.batch_poll_interval_s)
                continue
            except Exception:  # a bug must not stop batch work for good: say it, and go on
                log.exception("claiming a batch item failed")
                await asyncio.sleep(s.batch_poll_interval_s)
                continue
            if item is None:
                await self.queue.wait_for_work(self._idle_wait_s())
                continue
            task = asyncio.get_running_loop().create_task(self._run(item), name=f"batch-item-{item.request_id}")
            self._running[task] = item
            task.add_done_callback(self._running.pop)

    def _idle_wait_s(self) -> float:
        """How long an idle worker may wait for a wake-up: until the first item it gave back comes due, at
        most `batch_idle_poll_s`."""
        now = time.monotonic()
        while self._given_back and self._given_back[0] <= now:
            heapq.heappop(self._given_back)
        wait_s = self.settings.batch_idle_poll_s
        return min(wait_s, self._given_back[0] - now) if self._given_back else wait_s

    async def _run(self, item: ClaimedItem) -> None:
        s = self.settings
        renewing = asyncio.get_running_loop().create_task(self._renew(item))
        if self.drain is not None:
            self.drain.enter()
        outcome = "interrupted"
        try:
            try:
                answer, outcome = await self._answer(item)
            except Busy as busy:
                self._quiet_until = time.monotonic() + PAUSE_WHEN_BUSY_S
                outcome = "given_back"
                retry_in_s = min(busy.retry_in_s, MAX_RETRY_S)
                await self.queue.release(item, retry_in_s)
                heapq.heappush(self._given_back, time.monotonic() + retry_in_s)
                return
            finally:
                renewing.cancel()
            if not await self.queue.complete(item, answer, s.batch_results_ttl_s):
                outcome = "duplicate"
        except StoreUnavailable as exc:  # its lease lapses: the item is claimed again later
            outcome = "interrupted"
            log.warning("a batch item could not be stored; it will run again", request_id=item.request_id,
                        error=str(exc))
        except Exception:
            outcome = "interrupted"
            log.exception("a batch item failed; it will run again", request_id=item.request_id)
        finally:
            self.metrics.batch_item_runs.labels(outcome).inc()
            if self.drain is not None:
                self.drain.leave()

    async def _renew(self, item: ClaimedItem) -> None:
        while True:
            await asyncio.sleep(self.settings.batch_lease_s / 3)
            with contextlib.suppress(StoreUnavailable):
                if not await self.queue.renew(item, self.settings.batch_lease_s):
                    log.warning("a batch item's lease was lost; another worker may run it", request_id=item.request_id)
                    return

    async def _answer(self, item: ClaimedItem) -> tuple[str, str]:
        """The item's answer entry (JSON text) and its outcome (ok, error), or Busy."""
        entry = Item.from_json(item.payload)
        if item.attempt - item.released > self.settings.batch_max_attempts:
            error = InternalError(f"the item was tried {self.settings.batch_max_attempts} times and its worker "
                                  "stopped each time; send it again")
            return failed(item.index, entry.reference, error), "error"
        try:
            return answered(item.index, entry.reference, await self._result(item, entry)), "ok"
        except GatewayError as exc:
            if is_busy(exc):
                raise Busy(exc.retry_after_s or 1.0) from exc
            return failed(item.index, entry.reference, exc), "error"
        except StoreUnavailable as exc:
            raise Busy(1.0) from exc

    async def _principal(self, item: ClaimedItem) -> Principal:
        key = await self.tenancy.get_key(item.key_id)
        tenant = await self.tenancy.get_tenant(item.tenant_id)
        if key is None or tenant is None or key.revoked_at is not None:
            raise AuthenticationFailed("Authentication error: the API key that queued this batch was revoked")
        principal = Principal(key=key, tenant=tenant, account_id=item.account_id)
        self.auth.authorize_model(principal, item.model)
        return principal

    async def _result(self, item: ClaimedItem, entry: Item) -> dict[str, Any]:
        principal = await self._principal(item)
        model = self.catalog.get(item.model)
        ctx = RequestContext(request_id=item.request_id, principal=principal, model=model, session_id=None,
                             arrived_perf=time.perf_counter(), arrived_at=time.time(),
                             metadata={"batch_id": item.batch_id})
        if model.task == EMBEDDING_TASK:
            embedded = await self.embedder.embed(ctx, parse_workers_ai_embedding(entry.request))
            return {**envelopes.workers_ai_embeddings(embedded.vectors), "usage": embedded.usage.as_dict()}
        inp = generation_input(entry)
        generation = await self.generator.start(ctx, inp)
        text = await generation.collect()
        return workers_ai_result(generation, inp, text)
