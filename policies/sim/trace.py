"""Trace records (Mooncake format) and what the replay derives from them.

One record: `{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}`
with one hash id per `block_size` (512) tokens of the prompt; requests that share leading ids
share that prefix. The trace has no tenants or sessions, so the replay assigns both from the
first hash id: a group of requests that start with the same block is one tenant and one session
(one conversation). Each request's ids become tenant-salted chain hashes through
`policies.prefix.chain_hashes`, one id per block, so equal leading ids give equal block hashes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from policies.errors import PolicyError
from policies.prefix import chain_hashes


class TraceError(PolicyError):
    pass


@dataclass(slots=True, frozen=True)
class TraceRequest:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    @classmethod
    def from_record(cls, record: Mapping[str, object], where: str = "record") -> TraceRequest:
        try:
            hash_ids = record["hash_ids"]
            if not isinstance(hash_ids, list):
                raise TypeError("hash_ids is not a list")
            request = cls(
                _as_int(record["timestamp"]),
                _as_int(record["input_length"]),
                _as_int(record["output_length"]),
                tuple(_as_int(h) for h in hash_ids),
            )
        except (KeyError, TypeError) as exc:
            raise TraceError(
                f"{where}: needs integer timestamp, input_length, output_length and a list hash_ids ({exc!r})"
            ) from None
        if request.timestamp_ms < 0 or request.input_length < 1 or request.output_length < 0 or not request.hash_ids:
            raise TraceError(f"{where}: timestamp >= 0, input_length >= 1, output_length >= 0, hash_ids non-empty")
        return request

    @classmethod
    def from_line(cls, line: str, where: str = "line") -> TraceRequest:
        """One JSONL line of a trace; the caller reads the file and names the place in `where`."""
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise TraceError(f"{where}: expected a JSON object")
        return cls.from_record(record, where)


def _as_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value


@dataclass(slots=True, frozen=True)
class SimRequest:
    """A trace request ready to route: times in seconds, hashes computed once for every policy."""

    index: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    tenant: str
    session_id: str
    block_hashes: tuple[int, ...]


def prepare(requests: Iterable[TraceRequest]) -> list[SimRequest]:
    """Sort by arrival (stable) and derive tenant, session and block hashes."""
    ordered = sorted(requests, key=lambda r: r.timestamp_ms)
    prepared = []
    for i, r in enumerate(ordered):
        group = f"g{r.hash_ids[0]}"
        hashes = tuple(chain_hashes(f"tenant-{group}", ([h] for h in r.hash_ids)))
        prepared.append(
            SimRequest(i, r.timestamp_ms / 1000, r.input_length, r.output_length, f"tenant-{group}", group, hashes)
        )
    return prepared


def num_distinct_blocks(requests: Iterable[SimRequest]) -> int:
    return len({h for r in requests for h in r.block_hashes})


def ceiling_hits(requests: Iterable[SimRequest]) -> tuple[int, int]:
    """(reusable blocks, all blocks) with one unlimited cache and longest-prefix reuse.

    A chain hash names its whole prefix, so a request's reusable blocks are its leading blocks
    whose hashes any earlier request produced.
    """
    seen: set[int] = set()
    hits = total = 0
    for r in requests:
        total += len(r.block_hashes)
        hits += leading_hits(r.block_hashes, seen)
        seen.update(r.block_hashes)
    return hits, total


def leading_hits(block_hashes: tuple[int, ...], cached: set[int] | Mapping[int, object]) -> int:
    n = 0
    for h in block_hashes:
        if h not in cached:
            break
        n += 1
    return n
