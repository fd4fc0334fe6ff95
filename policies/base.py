"""The routing interface: candidates in, one candidate (or None) out.

A `Candidate` is a per-request view of one backend: its health, the tokens in flight to it
(prefill and decode counted apart) and how many of *this request's* prompt tokens it already
holds in its KV cache (the caller fills that in from its prefix index, or from exact KV events).
Where a backend has tiers below its KV pool (a host-memory tier, a regional pool shared by the
region's backends), the candidate also says how many tokens after its cached prefix each tier
would supply; reusing them costs a copy or a fetch, a share of prefilling them (`TierCosts`).
Without tier information those counts are 0 and every score is what it was without tiers.
`RouteInfo` carries everything else a policy may look at, in one dataclass, so a new input never
changes a policy's signature.

A `Policy` has a `name` and `select(candidates, info) -> Candidate | None`. `select` filters
healthy candidates once (`healthy_candidates`) and hands them to the policy's `choose`; it
returns None only when no candidate is healthy. A policy returns a choice and nothing else: the
caller records metrics and bumps in-flight counts. The hooks `on_complete` and `update_loads`
do nothing unless a policy needs them; `score_of` explains a decision where a policy has a score.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from policies.errors import PolicyConfigError, PolicyError


@dataclass(slots=True, frozen=True)
class TierCosts:
    """What reusing one token from a tier below the KV pool costs, as a share of prefilling it."""

    host_tier: float = 0.1  # a host-to-device copy of a token's KV
    region_pool: float = 0.2  # a network fetch from the region's pool

    def __post_init__(self) -> None:
        if not 0 <= self.host_tier <= 1 or not 0 <= self.region_pool <= 1:
            raise PolicyConfigError(
                f"host_tier_cost={self.host_tier}, region_pool_cost={self.region_pool}: each is a share of "
                "a prefill token's cost; give values within [0, 1]"
            )


DEFAULT_TIER_COSTS = TierCosts()


@dataclass(slots=True, frozen=True)
class Candidate:
    """One backend as a policy sees it for one request."""

    id: str
    region: str = "default"
    healthy: bool = True
    in_flight_prefill_tokens: int = 0  # prompt tokens sent there and not yet prefilled
    in_flight_decode_tokens: int = 0  # tokens still to generate there (estimated)
    cached_prefix_tokens: int = 0  # leading tokens of this request's prompt cached there (its KV pool)
    host_tier_tokens: int = 0  # the tokens right after those that its host-memory tier holds
    region_pool_tokens: int = 0  # the tokens right after those that its region's shared pool holds
    adapter_load_tokens: int = 0  # loading the request's LoRA adapter there, in prefill tokens (policies/adapters.py)

    def __post_init__(self) -> None:
        if not self.id:
            raise PolicyError("Candidate.id must be a non-empty backend id")
        for name in (
            "in_flight_prefill_tokens", "in_flight_decode_tokens", "cached_prefix_tokens", "host_tier_tokens",
            "region_pool_tokens", "adapter_load_tokens",
        ):
            if getattr(self, name) < 0:
                raise PolicyError(f"Candidate {self.id!r}: {name}={getattr(self, name)} must be >= 0")

    def load(self, decode_weight: float = 1.0) -> float:
        """In-flight tokens, decode tokens scaled by `decode_weight`."""
        return self.in_flight_prefill_tokens + decode_weight * self.in_flight_decode_tokens

    @property
    def reusable_prefix_tokens(self) -> int:
        """Leading prompt tokens it need not prefill: its pool's, then its host tier's, then the region's."""
        return self.cached_prefix_tokens + self.host_tier_tokens + self.region_pool_tokens

    def tier_cost(self, costs: TierCosts) -> float:
        """The copies and fetches of its tier hits, in prefill tokens."""
        return costs.host_tier * self.host_tier_tokens + costs.region_pool * self.region_pool_tokens

    def prefill_cost(self, num_prompt_tokens: int, costs: TierCosts) -> float:
        """The work before its first token there, in prefill tokens: what no tier holds, plus the
        tier hits' copies and fetches. A hit in its own pool is cheapest, then its host tier, then
        the regional pool, then a miss. A backend that must first load the request's LoRA adapter pays that too."""
        return max(0, num_prompt_tokens - self.reusable_prefix_tokens) + self.tier_cost(costs) + self.adapter_load_tokens

    def effective_cached_tokens(self, costs: TierCosts) -> float:
        """Cached prefix tokens, tier hits counted at the share of a prefill they save."""
        return self.reusable_prefix_tokens - self.tier_cost(costs)


@dataclass(slots=True, frozen=True)
class RouteInfo:
    """What a policy may know about the request being routed."""

    tenant: str
    session_id: str | None = None  # the client's x-session-affinity, if any
    request_id: str | None = None
    num_prompt_tokens: int = 0
    block_hashes: tuple[int, ...] = ()  # the prompt's tenant-salted block chain (policies.prefix)
    num_output_tokens: int = 0  # estimated tokens to generate (e.g. max_tokens)
    previous_backend_id: str | None = None  # where this session's last request went
    model: str | None = None

    def __post_init__(self) -> None:
        if self.num_prompt_tokens < 0 or self.num_output_tokens < 0:
            raise PolicyError("RouteInfo token counts must be >= 0")

    @property
    def routing_key(self) -> str:
        """A stable per-request key for tie-breaks: the session, else the request, else the prefix."""
        if self.session_id is not None:
            return f"{self.tenant}\x00s\x00{self.session_id}"
        if self.request_id is not None:
            return f"{self.tenant}\x00r\x00{self.request_id}"
        first = self.block_hashes[0] if self.block_hashes else self.num_prompt_tokens
        return f"{self.tenant}\x00p\x00{first}"


    @property
    def spread_key(self) -> str:
        """A per-request key for tie-breaks that should spread requests: the request, else the
        session, else the prefix. (Tie-breaking by session would send every tie of a client that
        uses one session id for everything to the same backend.)"""
        if self.request_id is not None:
            return f"{self.tenant}\x00r\x00{self.request_id}"
        return self.routing_key


def healthy_candidates(candidates: Sequence[Candidate]) -> list[Candidate]:
    """The healthy ones, in the given order; ids must be unique."""
    if len({c.id for c in candidates}) != len(candidates):
        raise PolicyError(f"duplicate candidate ids: {sorted(c.id for c in candidates)}")
    return [c for c in candidates if c.healthy]


def stable_hash(*parts: str) -> int:
    """A 64-bit hash that is the same in every process (unlike hash())."""
    digest = hashlib.blake2b("\x1f".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def load_bound(loads: Mapping[str, float], eps: float) -> float:
    """(1 + eps) x the mean load: above this a backend counts as overloaded."""
    return (1.0 + eps) * sum(loads.values()) / len(loads)


class Policy(ABC):
    """A routing policy. Subclasses set `name` and implement `choose`."""

    name: ClassVar[str]

    def select(self, candidates: Sequence[Candidate], info: RouteInfo) -> Candidate | None:
        """The chosen healthy candidate, or None when none is healthy."""
        healthy = healthy_candidates(candidates)
        return self.choose(healthy, info) if healthy else None

    @abstractmethod
    def choose(self, healthy: list[Candidate], info: RouteInfo) -> Candidate:
        """Pick one of `healthy` (never empty)."""

    def score_of(self, candidate: Candidate, info: RouteInfo) -> float | None:
        """The policy's score for one candidate (lower is better), for explaining decisions; None
        for policies that do not rank by a score."""
        return None

    def on_complete(self, backend_id: str, info: RouteInfo, *, success: bool = True) -> None:  # noqa: B027 (optional hook)
        """Called by the caller when a routed request finishes; nothing by default."""

    def update_loads(self, loads: Mapping[str, int]) -> None:  # noqa: B027 (optional hook)
        """Called with polled per-backend loads (in-flight tokens); nothing by default."""
