"""Evaluation traces derived from one Mooncake-format trace, reproducibly (a seed, no I/O).

Each variant keeps the source's arrivals, lengths and block structure and adds one thing that
real traffic has and the synthetic trace lacks:

- `shared_block`: every request begins with one shared block (a platform-wide system prompt);
- `tenants`: a few tenants, each with its own system prompt of 1-8 blocks that all its requests
  begin with; the source's groups of requests with the same first block (the prefixes it
  shares) are dealt to tenants with Zipf weights (a big tenant, small ones);
- `heavy_sessions`: the client keys x-session-affinity by user, not by conversation: each
  session id spans several conversations, with Pareto-distributed (heavy-tailed) sizes, so a
  few session ids carry a large share of the traffic;
- `one_session`: one client sends one session id for everything.

Prepending blocks lengthens prompts by 512 tokens a block (`BLOCK_TOKENS`). New block ids are
taken above the source's largest id, so they never collide with its blocks.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from policies.sim.conversations import derive_conversations
from policies.sim.trace import TraceRequest

BLOCK_TOKENS = 512


def _ordered(requests: Sequence[TraceRequest]) -> tuple[list[TraceRequest], list[int]]:
    ordered = sorted(requests, key=lambda r: r.timestamp_ms)
    return ordered, derive_conversations([r.tenant for r in ordered], [r.hash_ids for r in ordered])


def _prefixed(r: TraceRequest, prefix: Sequence[int], tenant: str | None = None) -> TraceRequest:
    return dataclasses.replace(
        r,
        input_length=r.input_length + BLOCK_TOKENS * len(prefix),
        hash_ids=(*prefix, *r.hash_ids),
        tenant=r.tenant if tenant is None else tenant,
    )


def shared_block(requests: Sequence[TraceRequest], seed: int = 0) -> list[TraceRequest]:
    shared = 1 + max(h for r in requests for h in r.hash_ids)
    return [_prefixed(r, [shared]) for r in sorted(requests, key=lambda r: r.timestamp_ms)]


def tenants(requests: Sequence[TraceRequest], seed: int = 0, num_tenants: int = 4) -> list[TraceRequest]:
    rng = random.Random(seed)
    next_id = 1 + max(h for r in requests for h in r.hash_ids)
    prompts = []
    for _ in range(num_tenants):
        length = rng.choice((1, 2, 4, 8))
        prompts.append(list(range(next_id, next_id + length)))
        next_id += length
    ordered = sorted(requests, key=lambda r: r.timestamp_ms)
    weights = [1 / (k + 1) for k in range(num_tenants)]  # Zipf, exponent 1
    groups = sorted({r.hash_ids[0] for r in ordered})
    tenant_of = dict(zip(groups, rng.choices(range(num_tenants), weights, k=len(groups)), strict=True))
    return [_prefixed(r, prompts[tenant_of[r.hash_ids[0]]], tenant=f"tenant-{tenant_of[r.hash_ids[0]]}") for r in ordered]


def heavy_sessions(requests: Sequence[TraceRequest], seed: int = 0, alpha: float = 1.1) -> list[TraceRequest]:
    """Session sizes (in conversations) ~ Pareto(alpha) rounded down, >= 1; alpha near 1 is a heavy tail."""
    rng = random.Random(seed)
    ordered, conversations = _ordered(requests)
    unassigned = sorted(set(conversations))
    rng.shuffle(unassigned)
    session_of: dict[int, str] = {}
    while unassigned:
        size = int(rng.paretovariate(alpha))
        group, unassigned = unassigned[:size], unassigned[size:]
        for c in group:
            session_of[c] = f"user-{group[0]}"
    return [dataclasses.replace(r, session_id=session_of[c]) for r, c in zip(ordered, conversations, strict=True)]


def one_session(requests: Sequence[TraceRequest], seed: int = 0) -> list[TraceRequest]:
    return [dataclasses.replace(r, session_id="everything") for r in sorted(requests, key=lambda r: r.timestamp_ms)]


def original(requests: Sequence[TraceRequest], seed: int = 0) -> list[TraceRequest]:
    return sorted(requests, key=lambda r: r.timestamp_ms)


Variant = Callable[[Sequence[TraceRequest], int], list[TraceRequest]]
VARIANTS: Mapping[str, Variant] = MappingProxyType(
    {
        "synthetic": original,
        "shared_block": shared_block,
        "tenants": tenants,
        "heavy_sessions": heavy_sessions,
        "one_session": one_session,
    }
)
