"""round_robin: each request goes to the next healthy backend in id order.

A counter advances once per request and indexes the healthy candidates sorted by id, so the
order does not depend on how the caller lists them. It ignores load and cache; it is the
baseline the other policies are measured against.
"""

from __future__ import annotations

from policies.base import Candidate, Policy, RouteInfo


class RoundRobin(Policy):
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, healthy: list[Candidate], info: RouteInfo) -> Candidate:
        ordered = sorted(healthy, key=lambda c: c.id)
        choice = ordered[self._next % len(ordered)]
        self._next += 1
        return choice
