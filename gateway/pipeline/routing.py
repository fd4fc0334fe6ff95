"""Routing: a prompt's tokens -> an ordered list of backends to try, and the bookkeeping around it.

`Router.route` hashes the prompt into blocks salted with the tenant's cache salt
(`gateway.pipeline.tenant_salt`, the same salt the backend gets as `cache_salt`; `policies.prefix`), asks the
store's routing state (one call) which backends hold how many of those blocks, what is in flight
to each and where the session went last, builds one `policies.base.Candidate` per backend serving
the model, picks the region (`policies.regions`: own first, then by distance, unhealthy skipped)
and lets the configured policy choose. The rest of that region (in the policy's order), then the
other regions, follow as failover targets. The request's tokens are counted in flight to the
chosen backend at once, so concurrent requests on any replica see them: by the request's admission
(`Flight.inflight`, gateway/pipeline/ticket.py), or here (`count=True`, the disaggregated flow's
steps).

`Flight` then tracks the request through its life: `started` (the backend that answered, which
may differ after failover: counts move, the session is pinned and the prefix recorded there, one
call), `first_token` (its prefill is done: those tokens leave the count) and `finished` (the rest
leaves; `finish` hands what is left to the request's settle instead). Each step is idempotent, so
the counts are released exactly once.

Where backends report tiers below their KV pool (events' `medium`), a candidate also says how
many prompt tokens after its cached prefix its host tier and its region's shared pool hold
(gateway/fleet/kv_tiers.py); the policies count those as a copy or a fetch.

Every decision is explainable: a debug log line "routing decision" lists each candidate's cached
tokens (and tier tokens), load and the policy's score (`Policy.score_of`, lower wins; None for policies without
one), and `Flight.explanation` carries the same in one line (`explain`). A request that
presents the admin token in `x-edgerun-explain` gets it back in the response header
`x-edgerun-routing` (gateway/http/api_inference.py); nobody else does (it names backends and loads).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import structlog

from backends.client import Endpoint
from contracts.prefix_hash import adapter_salt
from gateway.context import RequestContext
from gateway.errors import OutOfCapacity
from gateway.fleet.kv_tiers import tier_tokens
from gateway.fleet.monitor import BackendMonitor
from gateway.metrics import GatewayMetrics
from gateway.pipeline.tenant_salt import TenantSalts
from gateway.store.admission import Inflight
from gateway.store.routing import RouteKey, RouteView, RoutingState
from policies.adapters import adapter_load_tokens
from policies.base import Candidate, Policy, RouteInfo
from policies.prefix import block_hashes
from policies.regions import RegionPreference, choose_region

log = structlog.get_logger("edgerun.gateway.routing")

EXPLAIN_REQUEST_HEADER = "x-edgerun-explain"  # its value: the gateway's admin token
EXPLAIN_RESPONSE_HEADER = "x-edgerun-routing"


@dataclass(slots=True)
class Flight:
    """One routed request's in-flight tokens, released exactly once."""

    ctx: RequestContext
    info: RouteInfo  # what the policy saw (policies cannot import the context); given back to on_complete
    endpoints: list[Endpoint]  # the chosen backend first, then failover targets
    expected_cached_tokens: int  # what the prefix index predicted for the chosen backend
    cache_salt: str  # the tenant's derived salt: the backend request's `cache_salt` (the adapter is sent apart)
    backend_id: str  # where the tokens are counted now
    prefill_tokens: int  # still counted
    decode_tokens: int
    # what `explanation` explains: the policy and every candidate it was shown (None: nothing to explain)
    choice: tuple[Policy, Candidate, list[Candidate]] | None = None
    started: bool = False
    finished: bool = False
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _explanation: str | None = None

    @property
    def explanation(self) -> str:
        """`explain(...)`: each candidate's cached tokens, load and score. Written when first asked
        (an admin's x-edgerun-explain, or debug logging), not on every request: the candidates are
        frozen and a policy's `score_of` depends only on them and the request."""
        if self._explanation is None:
            self._explanation = explain(*self.choice, self.info) if self.choice else ""
        return self._explanation

    @property
    def chosen(self) -> Endpoint:
        return self.endpoints[0]

    @property
    def inflight(self) -> Inflight:
        """The tokens counted on the backend now."""
        return Inflight(self.backend_id, self.prefill_tokens, self.decode_tokens)

    @property
    def hashes(self) -> list[int]:
        """The prompt's tenant-salted block chain (the one the backend's KV events report)."""
        return list(self.info.block_hashes)


class Router:
    def __init__(
        self,
        routing: RoutingState,
        policy: Policy,
        regions: RegionPreference,
        monitor: BackendMonitor,
        metrics: GatewayMetrics,
        salts: TenantSalts,
        adapter_load_cost_tokens: int = 0,
    ) -> None:
        self.salts = salts
        self.adapter_load_cost_tokens = adapter_load_cost_tokens  # a backend without the request's adapter
        self.routing = routing
        self.policy = policy
        self.regions = regions
        self.monitor = monitor
        self.metrics = metrics

    async def route(
        self, ctx: RequestContext, endpoints: list[Endpoint], prompt_ids: list[int], max_tokens: int,
        *, count: bool = True,
    ) -> Flight:
        """Choose backends for one request (among `endpoints`, e.g. one disaggregated pool); `count`: count
        its `max_tokens` and prompt tokens in flight on the first choice now (else its admission does)."""
        tenant_id, session_id, model = ctx.tenant_id, ctx.session_id, ctx.model
        cache_salt = await self.salts.salt(tenant_id)
        # under a LoRA adapter the chain is the adapter's own, as the backend's is (contracts.prefix_hash)
        hashes = block_hashes(prompt_ids, model.block_size, adapter_salt(cache_salt, ctx.adapter))
        view = await self.routing.lookup(RouteKey(hashes, tenant_id, session_id))
        candidates = [
            candidate(e, view, self.monitor.is_healthy(e.id), model.block_size, len(prompt_ids),
                      adapter_load_tokens(ctx.adapter, self.monitor.resident_adapters(e.id), self.adapter_load_cost_tokens))
            for e in endpoints
        ]
        info = route_info(ctx, hashes, len(prompt_ids), max_tokens, view.previous_backend_id)
        ordered = self.order(candidates, info)
        if not ordered:  # every backend down or ejected: say when the first ejection runs out
            wait = self.monitor.outliers.retry_after_s(e.id for e in endpoints)
            raise OutOfCapacity(
                f"No more data centers to forward the request to: no healthy backend serves {model.id}",
                retry_after_s=max(1.0, wait or 1.0),
            )
        by_id = {e.id: e for e in endpoints}
        first = ordered[0]
        prefill = len(prompt_ids) - first.reusable_prefix_tokens
        flight = Flight(
            ctx=ctx,
            info=info,
            endpoints=[by_id[c.id] for c in ordered],
            expected_cached_tokens=first.reusable_prefix_tokens,
            cache_salt=cache_salt,
            choice=(self.policy, first, candidates),
            backend_id=first.id,
            prefill_tokens=prefill,
            decode_tokens=max_tokens,
        )
        if ctx.adapter is not None:  # it will be loaded there; the next /load poll confirms it
            self.monitor.note_adapter(first.id, ctx.adapter)
        if count:
            await self.routing.add_inflight(flight.inflight)
        self.metrics.routing_decisions.labels(self.policy.name, first.id).inc()
        if log.is_enabled_for(logging.DEBUG):
            log.debug("routing decision", request_id=ctx.request_id, policy=self.policy.name, explanation=flight.explanation)
        return flight

    def order(self, candidates: list[Candidate], info: RouteInfo) -> list[Candidate]:
        """Healthy candidates in try order: the policy's pick in the preferred region first, then the
        rest of that region, then the other regions in preference order (least loaded first within
        each). Only the first pick consults the policy, so stateful policies advance once per request."""
        healthy = [c for c in candidates if c.healthy]
        region = choose_region(healthy, self.regions)
        if region is None:
            return []
        pick = self.policy.select([c for c in healthy if c.region == region], info)
        assert pick is not None
        rank = {r: i for i, r in enumerate(self.regions.order(sorted({c.region for c in healthy})))}
        rest = sorted(
            (c for c in healthy if c.id != pick.id and c.region in rank),
            key=lambda c: (c.region != region, rank[c.region], c.load(), c.id),
        )
        return [pick, *rest]

    async def started(self, flight: Flight, endpoint: Endpoint) -> None:
        """The backend `endpoint` sent its first chunk: pin the session and record the prefix there (and
        move the counts there after a failover), in one call."""
        async with flight._lock:
            if flight.started:
                return
            flight.started = True
            moved = None
            if endpoint.id != flight.backend_id:  # failover: move the counts
                self.metrics.failovers.labels(endpoint.id).inc()
                moved = flight.inflight if flight.prefill_tokens or flight.decode_tokens else None
                flight.backend_id = endpoint.id
            ctx = flight.ctx
            if moved is not None or flight.hashes or ctx.session_id:
                await self.routing.started(endpoint.id, RouteKey(flight.hashes, ctx.tenant_id, ctx.session_id), moved)

    async def first_token(self, flight: Flight) -> None:
        """Prefill is over: its tokens leave the backend's in-flight count."""
        async with flight._lock:
            if flight.finished or flight.prefill_tokens == 0:
                return
            prefill, flight.prefill_tokens = flight.prefill_tokens, 0
            await self.routing.release_inflight(Inflight(flight.backend_id, prefill, 0))

    async def finished(self, flight: Flight, *, success: bool) -> None:
        """The request is over (done, cancelled or failed): release what is still counted."""
        left = await self.finish(flight, success=success)
        if left is not None:
            await self.routing.release_inflight(left)

    async def finish(self, flight: Flight, *, success: bool) -> Inflight | None:
        """The request is over: what is still counted, for the caller to release (None: nothing, or
        finished already)."""
        async with flight._lock:
            if flight.finished:
                return None
            flight.finished = True
            left = flight.inflight if flight.prefill_tokens or flight.decode_tokens else None
            flight.prefill_tokens = flight.decode_tokens = 0
        self.policy.on_complete(flight.backend_id, flight.info, success=success)
        return left


def candidate(
    endpoint: Endpoint, view: RouteView, healthy: bool, block_size: int, num_prompt_tokens: int, adapter_load: int = 0
) -> Candidate:
    """One backend for this request: its load, how much of the prompt its pool, its host tier and its
    region's pool hold, one after the other (gateway/fleet/kv_tiers.py), and what loading the request's LoRA
    adapter there costs (`adapter_load`, prefill tokens: policies/adapters.py)."""
    pool, host, region = tier_tokens(view.matched, endpoint.id, endpoint.region, block_size, num_prompt_tokens)
    prefill, decode = view.loads.get(endpoint.id, (0, 0))
    return Candidate(
        id=endpoint.id, region=endpoint.region, healthy=healthy, in_flight_prefill_tokens=prefill,
        in_flight_decode_tokens=decode, cached_prefix_tokens=pool, host_tier_tokens=host, region_pool_tokens=region,
        adapter_load_tokens=adapter_load,
    )


def route_info(
    ctx: RequestContext, hashes: list[int], num_prompt_tokens: int, max_tokens: int, previous: str | None
) -> RouteInfo:
    """The policy's view of the request: its identity from the context, and what routing found."""
    return RouteInfo(
        tenant=ctx.tenant_id,
        session_id=ctx.session_id,
        request_id=ctx.request_id,
        num_prompt_tokens=num_prompt_tokens,
        block_hashes=tuple(hashes),
        num_output_tokens=max_tokens,
        previous_backend_id=previous,
        model=ctx.model_id,
    )


def explain(policy: Policy, chosen: Candidate, candidates: list[Candidate], info: RouteInfo) -> str:
    """One line: `chosen=b1 b0:cached=0,load=1200,score=5200 b1:cached=4096,...` (unhealthy marked)."""
    parts = [f"chosen={chosen.id}"]
    for c in candidates:
        score = policy.score_of(c, info) if c.healthy else None
        text = f"{c.id}:cached={c.cached_prefix_tokens},load={c.load():g}"
        text += f",host_tier={c.host_tier_tokens}" if c.host_tier_tokens else ""
        text += f",region_pool={c.region_pool_tokens}" if c.region_pool_tokens else ""
        text += f",score={score:g}" if score is not None else ""
        parts.append(text if c.healthy else f"{text},unhealthy")
    return " ".join(parts)
