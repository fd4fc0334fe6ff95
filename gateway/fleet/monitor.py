"""Background watch over the backends: health, load and KV cache events.

Three asyncio loops, started and cancelled by the app's lifespan:
- health: `GET /health` on every backend each `health_interval_s`; the result decides whether a
  backend is a routing candidate (one passed check makes it healthy, `health_fall` failed ones
  in a row make it unhealthy). A request that finds a backend down before its first byte
  marks it unhealthy at once (`mark_unhealthy`), until a health check passes again. Repeated
  failures eject it for longer (`gateway.fleet.outliers`: a circuit breaker per backend, which requests
  feed through `record_error` / `record_success` and which each health check probes).
- load: `GET /load` on healthy backends each `load_interval_s`; the backend's own prefill/decode
  token counts correct the store's in-flight counters (which drift when a replica dies with
  requests in flight). Kinds without /load (third-party servers) are not asked; one that
  answers 404 is not asked again.
- KV events (kinds that serve them over HTTP: ours and trtllm-serve; vLLM's and SGLang's come
  over ZMQ, `gateway.fleet.kv_streams`):
  `POST /kv_cache_events?consumer=<replica id>` each `kv_events_interval_s`, fed to
  a `KVEventSink` (the prefix index updater in `gateway.fleet.kv_index`). The consumer id gives this
  replica its own cursor on our backends, so replicas do not take each other's events.
Backends start out healthy (optimistic) so a gateway can serve before its first check finishes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from backends.client import BackendClient, BackendError, BackendRejected, Endpoint
from gateway.fleet.cached_reports import CachedTokenReports
from gateway.fleet.outliers import OutlierDetector
from gateway.metrics import GatewayMetrics
from gateway.store.errors import StoreError
from gateway.store.routing import RoutingState
from policies.breaker import BreakerConfig

log = structlog.get_logger("edgerun.gateway.monitor")


class KVEventSink(Protocol):
    async def apply(self, backend_id: str, events: list[dict[str, Any]]) -> None: ...


@dataclass(slots=True)
class MonitoredBackend:
    endpoint: Endpoint
    healthy: bool = True
    checked_at: float | None = None
    failed_probes: int = 0  # consecutive failed health checks
    has_load_route: bool = True
    has_kv_events_route: bool = True
    # prompt blocks its tiers below the KV pool supplied so far, by tier ("host", "region"), from /load
    kv_tier_hit_blocks: dict[str, int] = field(default_factory=dict)
    adapters: frozenset[str] = frozenset()  # LoRA adapters it has loaded, as its last /load said


@dataclass(frozen=True, slots=True)
class MonitorIntervals:
    health_s: float = 2.0
    load_s: float = 1.0
    kv_events_s: float = 1.0
    # Consecutive failed health checks that mark a healthy backend down (HAProxy's `fall`, Envoy's
    # unhealthy_threshold). One slow probe is weak evidence: under a burst the gateway's own event
    # loop can lag past the probe timeout while the backend streams fine. A request that finds the
    # backend down still marks it at once (`mark_unhealthy`).
    health_fall: int = 3


class BackendMonitor:
    def __init__(
        self,
        endpoints: Iterable[Endpoint],
        client: BackendClient,
        routing: RoutingState,
        metrics: GatewayMetrics,
        intervals: MonitorIntervals,
        kv_sink: KVEventSink | None = None,
        kv_consumer: str | None = None,
        outliers: OutlierDetector | None = None,
    ) -> None:
        self.kv_consumer = kv_consumer  # our cursor's name on each backend (the replica id)
        # what each kind of server serves (backends.client.kinds); a 404 turns a route off too
        self.states = {
            e.id: MonitoredBackend(e, has_load_route=e.server.has_load_route, has_kv_events_route=e.server.kv_events == "poll")
            for e in endpoints
        }
        self.client = client
        self.routing = routing
        self.metrics = metrics
        self.intervals = intervals
        self.kv_sink = kv_sink
        self._tasks: list[asyncio.Task[None]] = []
        self.outliers = outliers or OutlierDetector(self.states, BreakerConfig(), metrics)
        # whether each backend's answers say how many prompt tokens were cached (billing depends on it)
        self.cached_reports = CachedTokenReports((s.endpoint for s in self.states.values()), metrics)
        for state in self.states.values():
            self._set_gauge(state)

    # -- queries ------------------------------------------------------------------------------

    def resident_adapters(self, backend_id: str) -> frozenset[str]:
        """The LoRA adapters `backend_id` has loaded (its last /load, plus those routed there since)."""
        state = self.states.get(backend_id)
        return state.adapters if state is not None else frozenset()

    def note_adapter(self, backend_id: str, adapter: str) -> None:
        """A request under `adapter` was routed to `backend_id`, which loads it: prefer it for the next ones."""
        state = self.states.get(backend_id)
        if state is not None:
            state.adapters = state.adapters | {adapter}

    def forget_adapter(self, backend_id: str, adapter: str) -> None:
        """`adapter` was unloaded from `backend_id` (its finetune was deleted): no longer a reason to go there."""
        state = self.states.get(backend_id)
        if state is not None:
            state.adapters = state.adapters - {adapter}

    def is_healthy(self, backend_id: str) -> bool:
        state = self.states.get(backend_id)
        return state is not None and state.healthy and self.outliers.admits(backend_id)

    def record_error(self, exc: BackendError, tenant: str, holder: str = "") -> None:
        """`tenant`'s request (`holder`: its id) met this backend error: counted against the backend it
        names as `gateway.fleet.outliers` says (a failed answer as the tenant's, a connection failure as anyone's)."""
        self.outliers.record_error(exc, tenant, holder)

    def errors_of(self, tenant: str, holder: str) -> Callable[[BackendError], None]:
        """`record_error` for the errors request `holder` of `tenant` meets (the backend client's failover hook)."""
        return lambda exc: self.outliers.record_error(exc, tenant, holder)

    def may_try(self, endpoint: Endpoint, holder: str = "") -> bool:
        """Asked just before request `holder` goes to `endpoint`: False for a second request to a backend on trial."""
        return self.outliers.may_try(endpoint.id, holder)

    def end_trials(self, holder: str) -> None:
        """A trial request `holder` holds is free again: the request got its first byte, or it is over
        without a verdict (`gateway.fleet.outliers`)."""
        self.outliers.end_trials(holder)

    def record_success(self, backend_id: str) -> None:
        self.outliers.record_success(backend_id)

    def healthy_first(self, endpoints: Iterable[Endpoint]) -> list[Endpoint]:
        return sorted(endpoints, key=lambda e: not self.is_healthy(e.id))

    def mark_unhealthy(self, backend_id: str, reason: str) -> None:
        state = self.states.get(backend_id)
        if state is not None and state.healthy:
            state.healthy = False
            self._set_gauge(state)
            log.warning("backend marked unhealthy", backend=backend_id, reason=reason)

    # -- one round of each loop (also what tests call) -----------------------------------------

    async def check_health(self) -> None:
        states = list(self.states.values())
        results = await asyncio.gather(*(self.client.health(s.endpoint) for s in states))
        now = time.time()
        for state, passed in zip(states, results, strict=True):
            state.failed_probes = 0 if passed else state.failed_probes + 1
            healthy = passed or (state.healthy and state.failed_probes < self.intervals.health_fall)
            if healthy != state.healthy:
                log.info("backend health changed", backend=state.endpoint.id, healthy=healthy)
            state.healthy, state.checked_at = healthy, now
            self._set_gauge(state)
            self.outliers.record_probe(state.endpoint.id, passed=passed)

    async def poll_loads(self) -> None:
        async def one(state: MonitoredBackend) -> None:
            try:
                load = await self.client.load(state.endpoint)
                prefill, decode = int(load.get("prefill_tokens", 0)), int(load.get("decode_tokens", 0))
                tiers = load.get("kv_tier_hit_blocks")
                if isinstance(tiers, dict):
                    state.kv_tier_hit_blocks = {str(k): int(v) for k, v in tiers.items()}
                adapters = load.get("adapters", [])
                state.adapters = frozenset(a for a in adapters if isinstance(a, str)) if isinstance(adapters, list) else frozenset()
            except BackendError as exc:
                if isinstance(exc, BackendRejected) and exc.status in (404, 405):
                    state.has_load_route = False
                return
            except (TypeError, ValueError):
                return
            await self.routing.correct_inflight(state.endpoint.id, prefill, decode)
            self.metrics.backend_in_flight.labels(state.endpoint.id, "prefill").set(prefill)
            self.metrics.backend_in_flight.labels(state.endpoint.id, "decode").set(decode)

        await asyncio.gather(*(one(s) for s in self.states.values() if s.healthy and s.has_load_route))

    async def poll_kv_events(self) -> None:
        sink = self.kv_sink
        if sink is None:
            return

        async def one(state: MonitoredBackend) -> None:
            try:
                events = await self.client.kv_cache_events(state.endpoint, self.kv_consumer)
            except BackendError as exc:
                if isinstance(exc, BackendRejected) and exc.status in (404, 405):
                    state.has_kv_events_route = False
                return
            if events:
                await sink.apply(state.endpoint.id, events)

        await asyncio.gather(*(one(s) for s in self.states.values() if s.healthy and s.has_kv_events_route))

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        loops = [
            ("health", self.check_health, self.intervals.health_s),
            ("load", self.poll_loads, self.intervals.load_s),
            ("kv_events", self.poll_kv_events, self.intervals.kv_events_s),
        ]
        self._tasks = [asyncio.create_task(self._every(n, fn, s), name=f"monitor-{n}") for n, fn, s in loops]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _every(self, name: str, step: Callable[[], Awaitable[None]], interval_s: float) -> None:
        while True:
            try:
                await step()
            except (BackendError, StoreError) as exc:
                log.warning("monitor step failed", loop=name, error=str(exc))
            except Exception:
                log.exception("monitor step crashed", loop=name)
            await asyncio.sleep(interval_s)

    def _set_gauge(self, state: MonitoredBackend) -> None:
        self.metrics.backend_healthy.labels(state.endpoint.id, state.endpoint.region).set(1 if state.healthy else 0)
