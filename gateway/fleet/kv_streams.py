"""The ZMQ KV event streams of vLLM and SGLang backends, feeding the prefix index.

One asyncio task per backend configured with `kv_events` (`[[backends]]`), started and cancelled
by the app's lifespan: it subscribes (`backends.client.zmq_events.EventSubscriber`, which recovers
lost messages through the replay socket) and hands each batch to that backend's
`gateway.fleet.engine_index.EngineBlockMap`. A lost stream or a restarted publisher clears what
the map entered, so the index never keeps blocks the engine may no longer hold. Each gateway
replica subscribes on its own: a PUB socket sends every subscriber every message.
"""

from __future__ import annotations

import asyncio

import structlog

from backends.client.engine_events import EventBatch
from backends.client.zmq_events import EventSubscriber, close_context, new_context
from gateway.fleet.catalog import BackendSpec, Catalog
from gateway.fleet.engine_index import EngineBlockMap
from gateway.metrics import GatewayMetrics
from gateway.store.errors import StoreError
from gateway.store.routing import RoutingState

log = structlog.get_logger("edgerun.gateway.kv_streams")

RETRY_S = 1.0  # after a stream failed for a reason other than cancellation


class EngineEventStreams:
    def __init__(self, catalog: Catalog, routing: RoutingState, metrics: GatewayMetrics) -> None:
        self.routing = routing
        self.metrics = metrics
        self.maps: dict[str, EngineBlockMap] = {}
        self._specs: list[BackendSpec] = []
        for backend in catalog.backends:
            if backend.event_source() is None:
                continue
            sizes = {catalog.get(model_id).block_size for model_id in backend.models}
            if len(sizes) != 1:
                log.warning("kv events ignored: the backend's models differ in block_size", backend=backend.id)
                continue
            self.maps[backend.id] = EngineBlockMap(routing, backend.id, sizes.pop())
            self._specs.append(backend)
        self._tasks: list[asyncio.Task[None]] = []
        self._context = new_context() if self._specs else None

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._follow(spec), name=f"kv-events-{spec.id}") for spec in self._specs
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._context is not None:
            close_context(self._context)
            self._context = None

    async def _follow(self, spec: BackendSpec) -> None:
        source, engine_map = spec.event_source(), self.maps[spec.id]
        assert source is not None and self._context is not None
        subscriber = EventSubscriber(source, self._context)
        batches = self.metrics.kv_event_batches.labels(spec.id)
        resets = self.metrics.kv_event_resets.labels(spec.id)

        async def on_batch(batch: EventBatch) -> None:
            batches.inc()
            try:
                await engine_map.apply(batch.events)
            except StoreError as exc:  # the index is a hint: a store outage costs entries, not the stream
                log.warning("kv events not indexed", backend=spec.id, error=str(exc))
            self._count_skipped(spec.id, engine_map)

        async def on_reset(reason: str) -> None:
            resets.inc()
            try:
                await engine_map.clear()
            except StoreError as exc:
                log.warning("kv index not cleared", backend=spec.id, error=str(exc))

        while True:
            try:
                await subscriber.run(on_batch, on_reset)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("kv event stream failed; resubscribing", backend=spec.id, endpoint=source.endpoint)
                await asyncio.sleep(RETRY_S)

    def _count_skipped(self, backend_id: str, engine_map: EngineBlockMap) -> None:
        skipped = engine_map.skipped
        for reason, count in (("unsalted", skipped.unsalted), ("orphan", skipped.orphans), ("foreign", skipped.foreign)):
            self.metrics.kv_blocks_skipped.labels(backend_id, reason).set(count)
