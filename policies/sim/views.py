"""What one gateway knows when it routes: the exact truth, or a replica's delayed, partial view.

`ExactView` is a single router that sees every backend's cache and in-flight tokens as they
are at that instant (an ideal prefix index; the classic replay).

`ReplicaView` is one of N gateway replicas that route independently, each receiving only its
own share of the traffic, as a gateway deployed at many edge locations does. It knows:
- its own decisions at once: the prefix it sent to a backend is recorded there (the router does
  this when the backend answers) and its own in-flight tokens are exact;
- everything else only when it polls, every `interval_s` (the gateway's `kv_events_interval_s`
  and `load_interval_s`, 1 s by default), each replica at its own phase: the backends'
  `/kv_cache_events` since its last poll (blocks stored and evicted, whoever caused them) and
  their in-flight tokens, from which it keeps the part that is not its own.
Between polls, the load it sees on a backend is the others' tokens as of its last poll plus its
own tokens now; it remembers its own sessions only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.base import Candidate
from policies.sim.backend import SimBackend
from policies.sim.trace import SimRequest, leading_hits


@dataclass(slots=True)
class ExactView:
    backends: list[SimBackend]
    id: int = 0
    sessions: dict[str, str] = field(default_factory=dict)

    def cached_blocks(self, backend: SimBackend, r: SimRequest) -> int:
        return backend.cache.cached_prefix_blocks(r.block_hashes)

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
    held: dict[str, set[int]] = field(default_factory=dict)  # backend -> block hashes it is believed to hold
    cursors: dict[str, int] = field(default_factory=dict)  # backend -> events read
    others: dict[str, tuple[int, int]] = field(default_factory=dict)  # backend -> others' tokens at last poll

    def cached_blocks(self, backend: SimBackend, r: SimRequest) -> int:
        return leading_hits(r.block_hashes, self.held.get(backend.id, set()))

    def load(self, backend: SimBackend, now: float) -> tuple[int, int]:
        own = backend.in_flight(now, owner=self.id)
        others = self.others.get(backend.id, (0, 0))
        return others[0] + own[0], others[1] + own[1]

    def record(self, backend: SimBackend, r: SimRequest) -> None:
        self.held.setdefault(backend.id, set()).update(r.block_hashes)

    def poll(self, now: float) -> None:
        for b in self.backends:
            held = self.held.setdefault(b.id, set())
            events = b.cache.events
            for _, stored, block_hash in events[self.cursors.get(b.id, 0) :]:
                if stored:
                    held.add(block_hash)
                else:
                    held.discard(block_hash)
            self.cursors[b.id] = len(events)
            total, own = b.in_flight(now), b.in_flight(now, owner=self.id)
            self.others[b.id] = (max(0, total[0] - own[0]), max(0, total[1] - own[1]))


View = ExactView | ReplicaView


def candidates(view: View, r: SimRequest, now: float, block_size: int) -> list[Candidate]:
    """One Candidate per backend, as `view` sees it at `now`."""
    result = []
    for b in view.backends:
        prefill, decode = view.load(b, now)
        cached = min(view.cached_blocks(b, r) * block_size, r.num_prompt_tokens)
        result.append(Candidate(b.id, in_flight_prefill_tokens=prefill, in_flight_decode_tokens=decode,
                                cached_prefix_tokens=cached))
    return result
