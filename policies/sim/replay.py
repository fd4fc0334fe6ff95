"""Replay prepared requests through one routing policy built by the real factory.

For each request, in arrival order: every backend becomes a `Candidate` with the in-flight
tokens and the number of this request's leading tokens cached there *as the routing gateway
sees them* (views.py): with `replicas=None` one gateway with an exact view (an ideal prefix
index), with `replicas=N` one of N independent gateway replicas fed by the backends' KV events
and loads with a polling delay, plus its own decisions. A request goes to replica
`stable_hash(conversation) % N` (a user reaches the nearest edge location, every turn the same).
Each gateway has its own policy instance and remembers its own sessions' last backends; a
policy's `on_complete` is called when a request ends. The policy picks a backend; the request's
blocks that are really cached there are counted as hits, its blocks go into that backend's LRU
cache at once (a later request may reuse them even while this one is still prefilling), and its
prefill and decode are queued (see backend.py). Every block of the trace counts, the last,
partial one included, as the trace's hash ids do.

With `host_tier_blocks_per_backend` or `region_pool_blocks` set, backends have the tiers of
tiers.py below their pools: a block found in any tier is a hit (not prefilled), and the copies
and fetches take their time in the backend's queue. Both 0 (the default) is the replay without
tiers, number for number.

Metrics:
- hit ratio = prompt blocks served from the chosen backend's cache / all prompt blocks, and
  its share of the trace's ceiling (one unlimited cache, longest-prefix reuse);
- work = uncached prompt tokens prefilled + output tokens decoded on a backend over the whole
  replay; "work max/mean" is the busiest backend's work over the mean;
- average in-flight = a backend's in-flight tokens averaged over the replay (exact integral);
  "avg in-flight max/mean" compares backends;
- peak in-flight = a backend's largest in-flight token count seen right after an admission;
  "peak max/mean" compares the backends' peaks the same way;
- hits per tier: blocks copied back from a host tier, blocks fetched from the regional pool;
- time to first token (queueing + own copies, fetches and prefill), mean, 90th and 99th percentile.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from policies.base import Policy, RouteInfo, stable_hash
from policies.factory import PolicyConfig, build_policy
from policies.sim.backend import SimBackend
from policies.sim.kv_cache import LRUBlockCache
from policies.sim.tiers import HOST_COPY_TOKENS_PER_S, REGION_FETCH_TOKENS_PER_S
from policies.sim.trace import SimRequest, ceiling_hits
from policies.sim.views import ExactView, ReplicaView, View, candidates


@dataclass(slots=True, frozen=True)
class SimConfig:
    num_backends: int = 8
    kv_blocks_per_backend: int = 1024
    block_size: int = 512  # tokens per trace hash id
    prefill_tokens_per_s: float = 16_000.0
    decode_tokens_per_s: float = 40.0  # per request: 25 ms between tokens
    replicas: int | None = None  # None: one gateway with an exact view; N: N replicas (views.py)
    poll_interval_s: float = 1.0  # how often a replica reads KV events and loads
    host_tier_blocks_per_backend: int = 0  # 0: no host-memory tier under the pools (tiers.py)
    region_pool_blocks: int = 0  # 0: no regional pool shared by the backends
    host_copy_tokens_per_s: float = HOST_COPY_TOKENS_PER_S
    region_fetch_tokens_per_s: float = REGION_FETCH_TOKENS_PER_S

    def __post_init__(self) -> None:
        if self.num_backends < 1 or self.kv_blocks_per_backend < 1 or self.block_size < 1:
            raise ValueError("num_backends, kv_blocks_per_backend and block_size must be >= 1")
        if self.replicas is not None and self.replicas < 1:
            raise ValueError(f"replicas={self.replicas} must be >= 1 (or None for one exact view)")
        if self.poll_interval_s <= 0:
            raise ValueError("poll_interval_s must be > 0")
        if self.prefill_tokens_per_s <= 0 or self.decode_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s and decode_tokens_per_s must be > 0")
        if self.host_tier_blocks_per_backend < 0 or self.region_pool_blocks < 0:
            raise ValueError("host_tier_blocks_per_backend and region_pool_blocks must be >= 0 (0: no such tier)")
        if self.host_copy_tokens_per_s <= 0 or self.region_fetch_tokens_per_s <= 0:
            raise ValueError("host_copy_tokens_per_s and region_fetch_tokens_per_s must be > 0")

    @property
    def has_tiers(self) -> bool:
        return self.host_tier_blocks_per_backend > 0 or self.region_pool_blocks > 0


@dataclass(slots=True, frozen=True)
class SimResult:
    policy: str
    replicas: int | None
    num_requests: int
    hit_blocks: int
    total_blocks: int
    ceiling_blocks: int
    work_tokens: tuple[int, ...]  # per backend
    peak_in_flight_tokens: tuple[int, ...]  # per backend
    avg_in_flight_tokens: tuple[float, ...]  # per backend, over the replay's duration
    requests_per_backend: tuple[int, ...]
    mean_ttft_s: float
    p99_ttft_s: float
    p90_ttft_s: float = 0.0
    host_hit_blocks: int = 0  # of hit_blocks: copied back from a backend's host tier
    region_hit_blocks: int = 0  # of hit_blocks: fetched from the regional pool

    @property
    def hit_ratio(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else 0.0

    @property
    def ceiling_ratio(self) -> float:
        return self.ceiling_blocks / self.total_blocks if self.total_blocks else 0.0

    @property
    def share_of_ceiling(self) -> float:
        return self.hit_blocks / self.ceiling_blocks if self.ceiling_blocks else 1.0

    @property
    def work_max_over_mean(self) -> float:
        return _max_over_mean(self.work_tokens)

    @property
    def avg_in_flight_max_over_mean(self) -> float:
        return _max_over_mean(self.avg_in_flight_tokens)

    @property
    def peak_max_over_mean(self) -> float:
        return _max_over_mean(self.peak_in_flight_tokens)

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "replicas": self.replicas,
            "num_requests": self.num_requests,
            "hit_blocks": self.hit_blocks,
            "total_blocks": self.total_blocks,
            "hit_ratio": self.hit_ratio,
            "ceiling_hit_ratio": self.ceiling_ratio,
            "share_of_ceiling": self.share_of_ceiling,
            "work_tokens": list(self.work_tokens),
            "work_max_over_mean": self.work_max_over_mean,
            "avg_in_flight_tokens": list(self.avg_in_flight_tokens),
            "avg_in_flight_max_over_mean": self.avg_in_flight_max_over_mean,
            "peak_in_flight_tokens": list(self.peak_in_flight_tokens),
            "peak_in_flight_max_over_mean": self.peak_max_over_mean,
            "requests_per_backend": list(self.requests_per_backend),
            "mean_ttft_s": self.mean_ttft_s,
            "p90_ttft_s": self.p90_ttft_s,
            "p99_ttft_s": self.p99_ttft_s,
            "host_hit_blocks": self.host_hit_blocks,
            "region_hit_blocks": self.region_hit_blocks,
        }


def simulate(requests: list[SimRequest], policy: PolicyConfig, config: SimConfig) -> SimResult:
    keep_events = config.replicas is not None
    backends = _backends(config, keep_events)
    by_id = {b.id: b for b in backends}
    views: list[View]
    if config.replicas is None:
        views = [ExactView(backends)]
    else:
        views = [ReplicaView(backends, i) for i in range(config.replicas)]
    routers: list[Policy] = [build_policy(policy) for _ in views]
    polls: Iterator[tuple[float, int]] = _poll_times(len(views), config.poll_interval_s) if keep_events else iter(())
    next_poll = next(polls, None)
    endings: list[tuple[float, int, int, str, RouteInfo]] = []  # (end, seq, replica, backend, info)
    hit_blocks = host_hits = region_hits = 0
    ttfts = []
    for r in requests:
        now = r.arrival_s
        while endings and endings[0][0] <= now:
            _, _, replica, backend_id, done = heapq.heappop(endings)
            routers[replica].on_complete(backend_id, done)
        while next_poll is not None and next_poll[0] <= now:
            views[next_poll[1]].poll(next_poll[0])
            next_poll = next(polls, None)
        replica = stable_hash("replica", r.conversation) % len(views)
        view, router = views[replica], routers[replica]
        info = RouteInfo(
            tenant=r.tenant,
            session_id=r.session_id,
            request_id=str(r.index),
            num_prompt_tokens=r.num_prompt_tokens,
            block_hashes=r.block_hashes,
            num_output_tokens=r.num_output_tokens,
            previous_backend_id=view.sessions.get(r.session_id),
        )
        choice = router.select(candidates(view, r, now, config.block_size), info)
        assert choice is not None  # every simulated backend is healthy
        backend = by_id[choice.id]
        hits = backend.lookup(r.block_hashes)  # the truth, whatever the view
        hit_blocks, host_hits, region_hits = hit_blocks + hits.blocks, host_hits + hits.host, region_hits + hits.region
        pool_tokens, host_tokens, region_tokens = hits.tokens(config.block_size, r.num_prompt_tokens)
        uncached = r.num_prompt_tokens - pool_tokens - host_tokens - region_tokens
        backend.store(r.block_hashes, hits, now)
        view.record(backend, r)
        fetch_s = backend.fetch_seconds(host_tokens, region_tokens)
        ttfts.append(backend.admit(now, uncached, r.num_output_tokens, owner=replica, fetch_s=fetch_s))
        heapq.heappush(endings, (backend.finish_time(), r.index, replica, backend.id, info))
        view.sessions[r.session_id] = backend.id
    ceiling, total = ceiling_hits(requests)
    duration = max(requests[-1].arrival_s - requests[0].arrival_s, 1.0) if requests else 1.0
    ttfts.sort()
    return SimResult(
        policy=routers[0].name,
        replicas=config.replicas,
        num_requests=len(requests),
        hit_blocks=hit_blocks,
        total_blocks=total,
        ceiling_blocks=ceiling,
        work_tokens=tuple(b.work_tokens for b in backends),
        peak_in_flight_tokens=tuple(b.peak_in_flight_tokens for b in backends),
        avg_in_flight_tokens=tuple(b.in_flight_token_seconds / duration for b in backends),
        requests_per_backend=tuple(b.num_requests for b in backends),
        mean_ttft_s=sum(ttfts) / len(ttfts) if ttfts else 0.0,
        p99_ttft_s=_percentile(ttfts, 0.99),
        p90_ttft_s=_percentile(ttfts, 0.9),
        host_hit_blocks=host_hits,
        region_hit_blocks=region_hits,
    )


def _backends(config: SimConfig, keep_events: bool) -> list[SimBackend]:
    """The backends, each with its pool over its own host tier, all sharing one regional pool."""
    region = LRUBlockCache(config.region_pool_blocks, keep_events) if config.region_pool_blocks else None
    backends = []
    for i in range(config.num_backends):
        host = (
            LRUBlockCache(config.host_tier_blocks_per_backend, keep_events)
            if config.host_tier_blocks_per_backend
            else None
        )
        pool = LRUBlockCache(config.kv_blocks_per_backend, keep_events, evict_to=host)
        backends.append(
            SimBackend(
                f"backend-{i}",
                pool,
                config.prefill_tokens_per_s,
                config.decode_tokens_per_s,
                region=region,
                host_copy_tokens_per_s=config.host_copy_tokens_per_s,
                region_fetch_tokens_per_s=config.region_fetch_tokens_per_s,
            )
        )
    return backends


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _poll_times(num_replicas: int, interval_s: float) -> Iterator[tuple[float, int]]:
    """(time, replica) of every poll in time order: replica i polls at (k + i / N) x interval."""
    return ((k * interval_s + i * interval_s / num_replicas, i) for k in itertools.count() for i in range(num_replicas))


def _max_over_mean(values: tuple[float, ...]) -> float:
    mean = sum(values) / len(values) if values else 0
    return max(values) / mean if mean else 1.0
