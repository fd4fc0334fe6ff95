"""Routing state: what routing reads to choose a backend, and what requests leave behind for the next.

Sessions (`x-session-affinity` -> the backend the session last went to, for `session_ttl_s`), the
prefix index (block hash -> the backends holding that KV block, bounded by
`prefix_index_max_entries` and `prefix_index_ttl_s`, least recently recorded dropped first), and
tokens in flight per backend (summed over the live gateway replicas: a replica that stops without
closing the store stops counting after `inflight_lease_s`). Admission counts a request's in-flight
tokens when it admits it and uncounts what is left when it settles (`gateway.store.admission`).

`lookup` reads all three in one call and `started` writes what a request's first answer teaches,
so routing a request costs two calls. Implementations: `local.routing.MemoryRouting` (one
process), `local.shared.SharedRouting` (several processes on one SQLite file) and
`redis.routing.RedisRouting`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.store.admission import Inflight
from gateway.store.checks import check_hashes, check_id, check_text

Loads = dict[str, tuple[int, int]]  # backend id -> (prefill, decode) tokens in flight; backends at (0, 0) left out


@dataclass(frozen=True, slots=True)
class RouteView:
    """What routing reads for one request."""

    loads: Loads = field(default_factory=dict)
    matched: dict[str, int] = field(default_factory=dict)  # backend -> leading blocks of the chain it holds (> 0)
    previous_backend_id: str | None = None  # where the session went last (None: no session, or expired)


@dataclass(frozen=True, slots=True)
class RouteKey:
    """Whose routing state a request reads (`lookup`) and writes (`started`): its prompt's block hash
    chain, its tenant and its session (None: no session). Checked on construction (InvalidArgument)."""

    block_hashes: Sequence[int]
    tenant_id: str
    session_id: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "block_hashes", check_hashes(self.block_hashes))
        check_id("tenant id", self.tenant_id)
        if self.session_id is not None:
            check_text("session id", self.session_id)


class RoutingState(Protocol):
    async def lookup(self, key: RouteKey) -> RouteView:
        """Every backend's in-flight tokens, how many leading blocks of the chain each holds, and the
        tenant's session's last backend (when the key has a session), in one call."""
        ...

    async def started(self, backend_id: str, key: RouteKey, moved: Inflight | None = None) -> None:
        """A request's backend answered: it holds the chain's blocks now (`record_prefix`), the session
        is pinned to it for `session_ttl_s` from now (each call renews it), and `moved` (the tokens
        counted on the backend first chosen, when another one answered after a failover) moves to it."""
        ...

    async def record_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        """Note that `backend_id` holds these blocks now (renewing their TTL and LRU position).

        The index keeps at most `prefix_index_max_entries` hashes, dropping the least recently
        recorded first, and forgets a (hash, backend) pair not recorded for `prefix_index_ttl_s`.
        """
        ...

    async def remove_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        """Note that `backend_id` evicted these blocks."""
        ...

    async def add_inflight(self, inflight: Inflight) -> None:
        """Count tokens this replica just sent to a backend (beyond what `admit` counted)."""
        ...

    async def release_inflight(self, inflight: Inflight) -> None:
        """Uncount tokens that finished (e.g. the prompt's, at the first token); counters stop at zero."""
        ...

    async def correct_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        """Align the backend's totals with its own report (GET /load) where the counts drifted.

        After the call `loads()[backend_id]` equals the report, except that it never drops below
        what other live replicas still hold for that backend.
        """
        ...

    async def loads(self) -> Loads:
        """backend id -> (prefill, decode) tokens in flight, summed over live gateway replicas."""
        ...
