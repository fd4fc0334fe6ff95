"""cache_aware (the default): fewest tokens to prefill plus load, with session stickiness.

1. Stickiness: if the session's previous backend is healthy and carries no more than
   (1 + eps) x the pool's mean in-flight tokens, the request goes back there (its KV cache is
   most likely still warm even when the prefix index has lost track of it).
2. Otherwise every healthy backend gets a cost, Dynamo-style:
       cost = uncached prompt tokens it would have to prefill + load_weight x its in-flight tokens
   where in-flight tokens = prefill + decode_weight x decode. Lowest cost wins; ties go to the
   lower load, then to the lower stable hash of (request key, backend id).
A prefix that many sessions share (a common system prompt) lowers the cost of the backends that
hold it by its length only; once their load exceeds another backend's by more than that length
/ load_weight, new sessions go elsewhere (which then holds it too), so it cannot pin all traffic
to one backend. A request that misses everywhere costs the same prefill on every backend and so
goes to the least loaded one, ties spread by hash.

Defaults: load_weight = 1, because a queued prefill token delays the new request about as much
as one of its own uncached tokens, so the cost reads as time to first token in prefill-token
units; decode_weight = 1 (tokens are tokens, as in a token-aware balancer); eps = 0.25, the
usual bounded-load slack. `edgerun simulate` replays a real trace to check them.
"""

from __future__ import annotations

from policies.base import Candidate, Policy, RouteInfo, load_bound, stable_hash
from policies.errors import PolicyConfigError


class CacheAware(Policy):
    name = "cache_aware"

    def __init__(self, load_weight: float = 1.0, decode_weight: float = 1.0, eps: float = 0.25) -> None:
        if load_weight < 0 or decode_weight < 0 or eps < 0:
            raise PolicyConfigError("cache_aware: load_weight, decode_weight and eps must be >= 0")
        self.load_weight = load_weight
        self.decode_weight = decode_weight
        self.eps = eps

    def choose(self, healthy: list[Candidate], info: RouteInfo) -> Candidate:
        loads = {c.id: c.load(self.decode_weight) for c in healthy}
        previous = next((c for c in healthy if c.id == info.previous_backend_id), None)
        if previous is not None and loads[previous.id] <= load_bound(loads, self.eps):
            return previous
        key = info.routing_key

        def score(c: Candidate) -> tuple[float, float, int]:
            to_prefill = max(0, info.num_prompt_tokens - c.cached_prefix_tokens)
            return (to_prefill + self.load_weight * loads[c.id], loads[c.id], stable_hash(key, c.id))

        return min(healthy, key=score)
