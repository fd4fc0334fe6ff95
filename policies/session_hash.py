"""session_hash: consistent hashing with bounded loads on (tenant, session).

Every backend owns `virtual_nodes` points on a 64-bit hash ring. A request's key (tenant plus
x-session-affinity, or the request's own key when it has no session) hashes to a point; the
first backend clockwise from it is the ring's choice, so a session keeps its backend and only
the sessions of a backend that leaves or joins move. Bounded load: when the ring's choice has
more than (1 + eps) x the mean in-flight tokens of the healthy pool, the walk goes on clockwise
to the next distinct backend under that bound (one always exists: the least loaded backend is
never above the mean).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from policies.base import Candidate, Policy, RouteInfo, load_bound, stable_hash
from policies.errors import PolicyConfigError


class HashRing:
    """Sorted ring points; `walk(point)` yields each backend id once, clockwise from `point`."""

    def __init__(self, backend_ids: Sequence[str], virtual_nodes: int) -> None:
        points = sorted((stable_hash("ring", bid, str(i)), bid) for bid in backend_ids for i in range(virtual_nodes))
        self.hashes = [h for h, _ in points]
        self.owners = [bid for _, bid in points]
        self.num_backends = len(set(backend_ids))

    def walk(self, point: int) -> Iterator[str]:
        start = bisect.bisect_left(self.hashes, point)
        seen: set[str] = set()
        for i in range(len(self.owners)):
            owner = self.owners[(start + i) % len(self.owners)]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == self.num_backends:
                    return


class SessionHash(Policy):
    name = "session_hash"

    def __init__(self, virtual_nodes: int = 160, eps: float = 0.25, decode_weight: float = 1.0) -> None:
        if virtual_nodes < 1:
            raise PolicyConfigError(f"session_hash: virtual_nodes={virtual_nodes} must be >= 1")
        if eps < 0 or decode_weight < 0:
            raise PolicyConfigError("session_hash: eps and decode_weight must be >= 0")
        self.virtual_nodes = virtual_nodes
        self.eps = eps
        self.decode_weight = decode_weight
        self._ring_ids: tuple[str, ...] = ()
        self._ring: HashRing | None = None

    def ring_for(self, backend_ids: tuple[str, ...]) -> HashRing:
        if self._ring is None or backend_ids != self._ring_ids:  # rebuilt only when the pool changes
            self._ring, self._ring_ids = HashRing(backend_ids, self.virtual_nodes), backend_ids
        return self._ring

    def choose(self, healthy: list[Candidate], info: RouteInfo) -> Candidate:
        by_id = {c.id: c for c in healthy}
        loads = {c.id: c.load(self.decode_weight) for c in healthy}
        bound = load_bound(loads, self.eps)
        ring = self.ring_for(tuple(sorted(by_id)))
        for backend_id in ring.walk(stable_hash("key", info.routing_key)):
            if loads[backend_id] <= bound:
                return by_id[backend_id]
        return min(healthy, key=lambda c: loads[c.id])  # only float rounding can get here
