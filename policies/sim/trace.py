"""Trace records (Mooncake format) and what the replay derives from them.

One record: `{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}`
with one hash id per `block_size` (512) tokens of the prompt; requests that share leading ids
share that prefix. Two optional fields say who sent it: `tenant` (default: one tenant for the
whole trace) and `session_id` (the client's x-session-affinity; default: the
request's conversation, derived from the blocks by `conversations.derive_conversations`). Each
request's ids become tenant-salted chain hashes through `policies.prefix.chain_hashes`, one id
per block, so equal leading ids of one tenant give equal block hashes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from policies.errors import PolicyError
from policies.prefix import chain_hashes
from policies.sim.conversations import derive_conversations

DEFAULT_TENANT = "trace"


class TraceError(PolicyError):
    pass


@dataclass(slots=True, frozen=True)
class TraceRequest:
    timestamp_ms: int
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    tenant: str = DEFAULT_TENANT
    session_id: str | None = None  # None: the request's derived conversation stands in

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
                _as_str(record.get("tenant", DEFAULT_TENANT)),
                None if record.get("session_id") is None else _as_str(record["session_id"]),
            )
        except (KeyError, TypeError) as exc:
            raise TraceError(
                f"{where}: needs integer timestamp, input_length, output_length, a list hash_ids and, "
                f"if given, a non-empty string tenant and a string session_id ({exc!r})"
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

    def to_record(self) -> dict[str, object]:
        """The JSON object `from_record` reads back (optional fields only when they say something)."""
        record: dict[str, object] = {
            "timestamp": self.timestamp_ms,
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": list(self.hash_ids),
        }
        if self.tenant != DEFAULT_TENANT:
            record["tenant"] = self.tenant
        if self.session_id is not None:
            record["session_id"] = self.session_id
        return record


def _as_int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value


def _as_str(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise TypeError(f"{value!r} is not a non-empty string")
    return value


@dataclass(slots=True, frozen=True)
class SimRequest:
    """A trace request ready to route: times in seconds, hashes computed once for every policy."""

    index: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    tenant: str
    session_id: str  # what the client sends as x-session-affinity
    block_hashes: tuple[int, ...]
    conversation: str = ""  # derived from the blocks (conversations.py), whatever the client sends


def prepare(requests: Iterable[TraceRequest]) -> list[SimRequest]:
    """Sort by arrival (stable) and derive conversations, sessions and block hashes."""
    ordered = sorted(requests, key=lambda r: r.timestamp_ms)
    conversations = derive_conversations([r.tenant for r in ordered], [r.hash_ids for r in ordered])
    prepared = []
    for i, (r, c) in enumerate(zip(ordered, conversations, strict=True)):
        conversation = f"c{c}"
        session = conversation if r.session_id is None else r.session_id
        hashes = tuple(chain_hashes(r.tenant, ([h] for h in r.hash_ids)))
        prepared.append(
            SimRequest(
                i, r.timestamp_ms / 1000, r.input_length, r.output_length, r.tenant, session, hashes, conversation
            )
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
