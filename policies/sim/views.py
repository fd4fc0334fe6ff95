"""What one gateway knows when it routes: the exact truth, or a replica's delayed, partial view.

`ExactView` is a single router that sees every backend's cache and in-flight tokens as they
are at that instant (an ideal prefix index; the classic replay).

`ReplicaView` is one of N gateway replicas that route independently, each receiving only its
own share of the traffic, as a gateway deployed at many edge locations does. It knows:
- its own decisions at once: the prefix it sent to a backend is recorded there (the router does
  this when the backend answers) and its own in-flight tokens are exact;
- everything else only when it polls, every `interval_s` (the gateway's `kv_events_interval_s`
  and `load_interval_s`, 1 s by default), each replica at its own phase: the backends'
  `/kv_cache_events` since its last poll (blocks stored and evicted, whoever caused them, in
  the pool, the host tier and the regional pool: the events' `medium`) and their in-flight
  tokens, from which it keeps the part that is not its own.
Between polls, the load it sees on a backend is the others' tokens as of its last poll plus its
own tokens now; it remembers its own sessions only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.base import Candidate
from policies.sim.backend import SimBackend
from policies.sim.kv_cache import LRUBlockCache
from policies.sim.tiers import TierHits, tier_hits
from policies.sim.trace import SimRequest

_REGION = "\x00region"  # the regional pool's key in a replica's maps (backend ids name the pools)


@dataclass(slots=True)
class ExactView:
    backends: list[SimBackend]
    id: int = 0
    sessions: dict[str, str] = field(default_factory=dict)

    def lookup(self, backend: SimBackend, r: SimRequest) -> TierHits:
        return backend.lookup(r.block_hashes)

    def load(self, backend: SimBackend, now: float) -> tuple[int, int]:
        return backend.in_flight(now)

    def record(self, backend: SimBackend, r: SimRequest) -> None:
        """Nothing to do: the cache itself is what this view reads."""

    def poll(self, now: float) -> None:
        """Nothing to do: this view is never stale."""


@dataclass(slots=True)
class ReplicaView:
    backends: list[SimBackend]
    id: int
    sessions: dict[str, str] = field(default_factory=dict)
    held: dict[str, set[int]] = field(default_factory=dict)  # cache -> block hashes it is believed to hold
    cursors: dict[str, int] = field(default_factory=dict)  # cache -> events read
    others: dict[str, tuple[int, int]] = field(default_factory=dict)  # backend -> others' tokens at last poll

    def lookup(self, backend: SimBackend, r: SimRequest) -> TierHits:
        pool, host, region = (None if cache is None else self.held.get(key, set()) for key, cache in _caches(backend))
        assert pool is not None
        return tier_hits(r.block_hashes, pool, host, region)

    def load(self, backend: SimBackend, now: float) -> tuple[int, int]:
        own = backend.in_flight(now, owner=self.id)
        others = self.others.get(backend.id, (0, 0))
        return others[0] + own[0], others[1] + own[1]

    def record(self, backend: SimBackend, r: SimRequest) -> None:
        """The blocks it sent are in the pool and, put after their prefill, in the regional pool."""
        self.held.setdefault(backend.id, set()).update(r.block_hashes)
        if backend.region is not None:
            self.held.setdefault(_REGION, set()).update(r.block_hashes)

    def poll(self, now: float) -> None:
        for b in self.backends:
            for key, cache in _caches(b):
                if cache is not None:
                    self._read_events(key, cache)
            total, own = b.in_flight(now), b.in_flight(now, owner=self.id)
            self.others[b.id] = (max(0, total[0] - own[0]), max(0, total[1] - own[1]))


    def _read_events(self, key: str, cache: LRUBlockCache) -> None:
        held = self.held.setdefault(key, set())
        for _, stored, block_hash in cache.events[self.cursors.get(key, 0) :]:
            if stored:
                held.add(block_hash)
            else:
                held.discard(block_hash)
        self.cursors[key] = len(cache.events)


View = ExactView | ReplicaView


def _caches(backend: SimBackend) -> tuple[tuple[str, LRUBlockCache | None], ...]:
    """(key, cache) for the backend's pool, host tier and regional pool (None where it has none)."""
    return (backend.id, backend.cache), (f"{backend.id}\x00host", backend.host), (_REGION, backend.region)


def candidates(view: View, r: SimRequest, now: float, block_size: int) -> list[Candidate]:
    """One Candidate per backend, as `view` sees it at `now`."""
    result = []
    for b in view.backends:
        prefill, decode = view.load(b, now)
        pool, host, region = view.lookup(b, r).tokens(block_size, r.num_prompt_tokens)
        result.append(Candidate(b.id, in_flight_prefill_tokens=prefill, in_flight_decode_tokens=decode,
                                cached_prefix_tokens=pool, host_tier_tokens=host, region_pool_tokens=region))
    return result
