"""The Mooncake trace, scaled down to a small CPU backend with its prefix sharing kept.

The trace (data/mooncake_synthetic_trace.jsonl) gives each request an arrival time,
input and output lengths, and one hash id per 512-token block of its prompt; requests that start
with the same ids share that prefix. The replay keeps that structure and shrinks everything else:

- blocks: every hash id becomes a fixed block of `block_tokens` words (one token each, see
  loadtests/words.py) drawn from a generator seeded by the id, so equal ids give equal tokens and
  shared leading ids give a shared token prefix. The last block is partial in proportion to the
  request's input length (a prefix of its full block). With `block_tokens` equal to the gateway's
  KV block size (16), one trace block is one cache block.
- lengths: at most `max_blocks` blocks per prompt (the leading ones, so sharing is kept);
  max_tokens = output_length x `output_scale`, between 2 and `max_output_tokens`.
- subset: the first `num_groups` groups of requests sharing their first hash id that have at
  least `min_group_requests` requests (so there is something to share), all of their requests,
  in trace order.
- time: arrival = (timestamp - first timestamp) x `time_scale`.
- tenants and sessions: one per group: the session id is the group's first hash id and the
  tenant is drawn by weight with a generator seeded by it, so one group never spans tenants
  (tenant-salted caches would otherwise split its prefix).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from loadtests.words import block_text
from policies.sim import trace as sim_trace
from policies.sim.trace import TraceRequest

SOURCE_BLOCK_TOKENS = 512
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "data" / "mooncake_synthetic_trace.jsonl"


class TraceError(sim_trace.TraceError):
    """The trace file is missing or a line is not a Mooncake trace record (a ValueError, and the
    simulator's TraceError, so either `except` catches it); the message names the file and line."""


def group_of(record: TraceRequest) -> int:
    """The record's group: its first hash id, shared by the requests that start with the same block."""
    return record.hash_ids[0]


@dataclass(frozen=True, slots=True)
class TraceScale:
    block_tokens: int = 16
    max_blocks: int = 32
    output_scale: float = 0.25
    max_output_tokens: int = 16
    num_groups: int = 8
    min_group_requests: int = 2
    time_scale: float = 1 / 16

    def __post_init__(self) -> None:
        if self.block_tokens < 1 or self.max_blocks < 1 or self.max_output_tokens < 2 or self.num_groups < 1:
            raise ValueError("block_tokens, max_blocks, num_groups must be >= 1 and max_output_tokens >= 2")
        if self.output_scale <= 0 or self.time_scale <= 0 or self.min_group_requests < 1:
            raise ValueError("output_scale and time_scale must be > 0, min_group_requests >= 1")


@dataclass(frozen=True, slots=True)
class ScaledRequest:
    arrival_s: float
    group: int
    prompt: str
    num_prompt_tokens: int  # what the prompt tokenizes to (one token per word)
    max_tokens: int


def read_trace(path: Path) -> list[TraceRequest]:
    """The trace's requests in file order (blank lines skipped), parsed by `TraceRequest.from_line`."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise TraceError(f"cannot read the trace {path}: {exc}") from exc
    try:
        return [TraceRequest.from_line(line, f"{path}:{n}") for n, line in enumerate(lines, 1) if line.strip()]
    except sim_trace.TraceError as exc:  # the record's own checks, said as an error of this file
        raise TraceError(str(exc)) from None


def select(records: Sequence[TraceRequest], scale: TraceScale) -> list[TraceRequest]:
    """The requests of the first `num_groups` groups with at least `min_group_requests` requests."""
    sizes = Counter(group_of(r) for r in records)
    chosen: list[int] = []
    for record in records:
        if len(chosen) == scale.num_groups:
            break
        if sizes[group_of(record)] >= scale.min_group_requests and group_of(record) not in chosen:
            chosen.append(group_of(record))
    keep = set(chosen)
    return [r for r in records if group_of(r) in keep]


def scale_request(record: TraceRequest, scale: TraceScale, start_ms: int) -> ScaledRequest:
    blocks = record.hash_ids[: scale.max_blocks]
    lengths = [scale.block_tokens] * len(blocks)
    if len(blocks) == len(record.hash_ids):  # the last block is the trace's partial one
        tail = record.input_length - SOURCE_BLOCK_TOKENS * (len(blocks) - 1)
        lengths[-1] = max(1, min(scale.block_tokens, math.ceil(scale.block_tokens * tail / SOURCE_BLOCK_TOKENS)))
    prompt = "".join(block_text(h, n) for h, n in zip(blocks, lengths))
    max_tokens = max(2, min(scale.max_output_tokens, round(record.output_length * scale.output_scale)))
    arrival = (record.timestamp_ms - start_ms) / 1000 * scale.time_scale
    return ScaledRequest(arrival, group_of(record), prompt, sum(lengths), max_tokens)


def scaled_trace(records: Sequence[TraceRequest], scale: TraceScale) -> list[ScaledRequest]:
    chosen = select(records, scale)
    if not chosen:
        raise TraceError(f"no group of the trace has {scale.min_group_requests} or more requests")
    start = chosen[0].timestamp_ms
    return [scale_request(r, scale, start) for r in chosen]


def reusable_block_ratio(records: Sequence[TraceRequest], max_blocks: int | None = None) -> float:
    """Share of blocks a single unlimited cache with longest-prefix reuse would serve (the ceiling).

    This is the simulator's ceiling (`policies.sim.trace.ceiling_hits`) over the records cut to
    their first `max_blocks` blocks: a block counts when an earlier request (in arrival order)
    had the same ids up to and including it. The simulator names each such prefix by a chain hash
    salted with a tenant that is itself the first id, so equal hashes are equal id prefixes.
    """
    cut = [replace(r, hash_ids=r.hash_ids[:max_blocks]) for r in records]
    hits, total = sim_trace.ceiling_hits(sim_trace.prepare(cut))
    return hits / total if total else 0.0
