"""least_tokens: the healthy backend with the fewest tokens in flight.

Load is in-flight prefill tokens plus `decode_weight` x in-flight decode tokens (tokens, not
requests: one 100k-token prompt is not the same load as one 10-token prompt). Ties go to the
lower stable hash of (request key, backend id), so equal loads spread over backends instead of
always landing on the first one. It ignores the prefix cache.
"""

from __future__ import annotations

from policies.base import Candidate, Policy, RouteInfo, stable_hash
from policies.errors import PolicyConfigError


class LeastTokens(Policy):
    name = "least_tokens"

    def __init__(self, decode_weight: float = 1.0) -> None:
        if decode_weight < 0:
            raise PolicyConfigError(f"least_tokens: decode_weight={decode_weight} must be >= 0")
        self.decode_weight = decode_weight

    def choose(self, healthy: list[Candidate], info: RouteInfo) -> Candidate:
        key = info.spread_key
        return min(healthy, key=lambda c: (c.load(self.decode_weight), stable_hash(key, c.id)))
