"""prefix_threshold: the reference policy, in the style of the SGLang router's cache_aware.

1. If the loads are imbalanced (the busiest backend carries more than `balance_rel` x the
   idlest's in-flight tokens *and* more than `balance_abs_tokens` beyond it), the request goes
   to the least loaded backend.
2. Otherwise, if the backend holding the longest cached prefix covers more than
   `cache_threshold` of the prompt, the request goes there;
3. else to the least loaded backend.
Ties go to the lower stable hash of (request id, backend id). Tokens a backend's host tier or
its region's pool would supply count as cached at the share of a prefill they save (1 minus
`host_tier_cost` or `region_pool_cost`, `Candidate.effective_cached_tokens`), so its own pool
ranks first, then its host tier, then the regional pool.

It is kept as the yardstick every routing benchmark compares against (`edgerun simulate`,
benchmarks/routing/simulator.py), and can be chosen like any other policy. SGLang counts requests in its
balance check (64 by default); we count tokens, so the absolute threshold is 64 requests of one
512-token block each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.base import DEFAULT_TIER_COSTS, Candidate, Policy, RouteInfo, TierCosts, stable_hash
from policies.errors import PolicyConfigError


@dataclass(eq=False)
class PrefixThreshold(Policy):
    name = "prefix_threshold"

    cache_threshold: float = 0.5
    balance_rel: float = 1.5
    balance_abs_tokens: float = 64 * 512.0
    decode_weight: float = 1.0
    host_tier_cost: float = DEFAULT_TIER_COSTS.host_tier
    region_pool_cost: float = DEFAULT_TIER_COSTS.region_pool
    tier_costs: TierCosts = field(init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.cache_threshold <= 1:
            raise PolicyConfigError(f"prefix_threshold: cache_threshold={self.cache_threshold} must be within [0, 1]")
        if self.balance_rel < 1 or self.balance_abs_tokens < 0 or self.decode_weight < 0:
            raise PolicyConfigError(
                "prefix_threshold: balance_rel must be >= 1, balance_abs_tokens and decode_weight >= 0"
            )
        self.tier_costs = TierCosts(self.host_tier_cost, self.region_pool_cost)

    def score_of(self, candidate: Candidate, info: RouteInfo) -> float:
        """The share of the prompt not cached there (the threshold compares its complement)."""
        cached = candidate.effective_cached_tokens(self.tier_costs)
        return 1.0 - cached / info.num_prompt_tokens if info.num_prompt_tokens else 1.0

    def choose(self, healthy: list[Candidate], info: RouteInfo) -> Candidate:
        key = info.spread_key
        loads = {c.id: c.load(self.decode_weight) for c in healthy}
        least_loaded = min(healthy, key=lambda c: (loads[c.id], stable_hash(key, c.id)))
        busiest, idlest = max(loads.values()), loads[least_loaded.id]
        if busiest > self.balance_rel * idlest and busiest - idlest > self.balance_abs_tokens:
            return least_loaded
        cached = {c.id: c.effective_cached_tokens(self.tier_costs) for c in healthy}
        best = max(healthy, key=lambda c: (cached[c.id], -loads[c.id], -stable_hash(key, c.id)))
        if info.num_prompt_tokens and cached[best.id] > self.cache_threshold * info.num_prompt_tokens:
            return best
        return least_loaded
