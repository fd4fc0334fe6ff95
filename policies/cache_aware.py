"""cache_aware (the default): fewest tokens to prefill plus load; a session's last backend as evidence.

1. Cost: every healthy backend gets, Dynamo-style,
       cost = uncached prompt tokens it would have to prefill + load_weight x its in-flight tokens
   where in-flight tokens = prefill + decode_weight x decode. Lowest cost wins; ties go to the
   lower load, then to the lower stable hash of (request id, backend id). Prompt tokens a
   backend's host tier or its region's pool holds are not prefilled but copied or fetched: each
   counts `host_tier_cost` or `region_pool_cost` of a prefill token (`Candidate.prefill_cost`).
   So a hit in the backend's own pool beats one in its host tier, which beats a regional-pool
   hit, which beats a miss; and with the regional pool holding a prefix, every backend of the
   region is nearly as cheap and load decides.
2. Stickiness is evidence, not an override. The session's previous backend is taken instead of
   the cheapest one only when all of these hold:
   - it carries no more than (1 + eps) x the pool's mean in-flight tokens;
   - no other backend holds a markedly longer prefix: at most `sticky_margin` x the prompt's
     tokens more than it, tier hits counted at the share of a prefill they save (when the prefix
     index knows nothing, no backend does, and the session's last backend is the best guess of
     where its KV cache is);
   - the session key does not carry more than its share of traffic: the tokens this router has
     in flight for that key (before this request) are at most its in-flight tokens for all
     requests / the number of healthy backends (a bounded load per session key). One x-session-affinity value sent for every user
     can therefore never pin a backend: it is routed by cost like a request without a session.
A prefix that many sessions share (a common system prompt) lowers the cost of the backends that
hold it by its length only; once their load exceeds another backend's by more than that length
/ load_weight, new sessions go elsewhere (which then holds it too), so it cannot pin all traffic
to one backend. A request that misses everywhere costs the same prefill on every backend and so
goes to the least loaded one, ties spread by hash.

Defaults: load_weight = 1, because a queued prefill token delays the new request about as much
as one of its own uncached tokens, so the cost reads as time to first token in prefill-token
units; decode_weight = 1 (tokens are tokens, as in a token-aware balancer); eps = 0.25, the
usual bounded-load slack; sticky_margin = 0.25 (a quarter of the prompt: the index is trusted
unless the difference it reports is small); host_tier_cost = 0.1 and region_pool_cost = 0.2 (a
PCIe copy and a 100 Gb/s fetch of a block's KV against prefilling it on one GPU:
policies/sim/tiers.py states the rates). `edgerun simulate` and benchmarks/routing/simulator.py replay
traces to check them.

State: the in-flight tokens per session key, added when a request is chosen and released by
`on_complete`; only keys with requests in flight are kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.base import DEFAULT_TIER_COSTS, Candidate, Policy, RouteInfo, TierCosts, load_bound, stable_hash
from policies.errors import PolicyConfigError


@dataclass(eq=False)
class CacheAware(Policy):
    name = "cache_aware"

    load_weight: float = 1.0
    decode_weight: float = 1.0
    eps: float = 0.25
    sticky_margin: float = 0.25
    host_tier_cost: float = DEFAULT_TIER_COSTS.host_tier
    region_pool_cost: float = DEFAULT_TIER_COSTS.region_pool
    tier_costs: TierCosts = field(init=False)
    _session_tokens: dict[str, int] = field(default_factory=dict, init=False)  # session key -> tokens in flight
    _total_tokens: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.load_weight < 0 or self.decode_weight < 0 or self.eps < 0 or not 0 <= self.sticky_margin <= 1:
            raise PolicyConfigError(
                "cache_aware: load_weight, decode_weight and eps must be >= 0, sticky_margin within [0, 1]"
            )
        self.tier_costs = TierCosts(self.host_tier_cost, self.region_pool_cost)

    def choose(self, healthy: list[Candidate], info: RouteInfo) -> Candidate:
        choice = self.sticky_choice(healthy, info) or min(healthy, key=lambda c: self.score(c, info))
        tokens = _tokens(info)
        self._total_tokens += tokens
        if info.session_id is not None:
            self._session_tokens[info.routing_key] = self._session_tokens.get(info.routing_key, 0) + tokens
        return choice

    def score(self, c: Candidate, info: RouteInfo) -> tuple[float, float, int]:
        """(cost, load, tie-break hash): lowest wins."""
        load = c.load(self.decode_weight)
        to_prefill = c.prefill_cost(info.num_prompt_tokens, self.tier_costs)
        return (to_prefill + self.load_weight * load, load, stable_hash(info.spread_key, c.id))

    def score_of(self, candidate: Candidate, info: RouteInfo) -> float:
        return self.score(candidate, info)[0]

    def sticky_choice(self, healthy: list[Candidate], info: RouteInfo) -> Candidate | None:
        """The session's previous backend when the evidence allows it (see the module docstring)."""
        previous = next((c for c in healthy if c.id == info.previous_backend_id), None)
        if previous is None or info.session_id is None:
            return None
        loads = {c.id: c.load(self.decode_weight) for c in healthy}
        if loads[previous.id] > load_bound(loads, self.eps):
            return None
        cached = {c.id: c.effective_cached_tokens(self.tier_costs) for c in healthy}
        if max(cached.values()) - cached[previous.id] > self.sticky_margin * info.num_prompt_tokens:
            return None
        if self._session_tokens.get(info.routing_key, 0) > self._total_tokens / len(healthy):
            return None
        return previous

    def on_complete(self, backend_id: str, info: RouteInfo, *, success: bool = True) -> None:
        tokens = _tokens(info)
        self._total_tokens = max(0, self._total_tokens - tokens)
        if info.session_id is None:
            return
        left = self._session_tokens.get(info.routing_key, 0) - tokens
        if left > 0:
            self._session_tokens[info.routing_key] = left
        else:
            self._session_tokens.pop(info.routing_key, None)


def _tokens(info: RouteInfo) -> int:
    return info.num_prompt_tokens + info.num_output_tokens
