"""vLLM's and SGLang's KV cache events, read off the wire into plain data.

Both engines publish on a ZMQ PUB socket (`backends.client.zmq_events` reads it) one multipart
message per batch: `topic, seq, payload`, where `seq` is an 8-byte big-endian counter and
`payload` is a msgpack array `[ts, [event, ...], rank?]` (the rank is vLLM's data-parallel rank
or SGLang's attention-DP rank). An event is one of:

- `BlockStored`: the engine cached full blocks. `block_hashes` (the engine's own hashes: bytes
  for vLLM's SHA-256 keys, 64-bit integers for SGLang and for vLLM with
  `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`), `parent_block_hash` (None for a chain's first block),
  `token_ids` (every new block's tokens, in order), `block_size`, `lora_id`, then, depending on
  the version, `medium` ("GPU", "CPU", ...), `lora_name`, `extra_keys` (vLLM: one entry per
  block, the first block's holding the request's `cache_salt`), `group_idx` and more.
- `BlockRemoved`: `block_hashes` evicted, with `medium` and `group_idx` where sent.
- `AllBlocksCleared`: the engine dropped its whole prefix cache.

Two encodings have shipped and both are read here. msgspec's tagged positional arrays
(`["BlockStored", hashes, parent, tokens, block_size, lora_id, medium, ...]`: SGLang, and vLLM
before its events became field maps) and tagged field maps (`{"type": "BlockStored",
"block_hashes": ..., ...}`: vLLM now, fields left out when at their default). SGLang's
`BlockStoredWithMetadata` shares the `BlockStored` tag and appends a map `{"cache_salt": ...}` as
its last element: that salt applies to every block of the event.

Anything this module does not understand (an unknown tag, a field of the wrong type, a token id
outside int32, which the prefix chain cannot hash) is counted and skipped, never guessed at: an
engine's odd event must cost an index entry, not a wrong one, and never the subscription (a payload
that is no msgpack batch at all raises `BadEventPayload`, whatever msgpack raised).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

EngineHash = int | bytes  # as the engine sent it; only ever compared, never interpreted
MAX_TOKEN_ID = 2**31 - 1  # contracts/prefix_hash.py packs token ids as int32

# Positions of BlockStored's fields in the array encoding (after the tag at 0), in the order both
# engines declare them: the later ones are absent from older versions.
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                  "lora_name", "extra_keys", "group_idx")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class BadEventPayload(ValueError):
    """A payload that is not a msgpack event batch at all (the whole message is skipped)."""


@dataclass(frozen=True, slots=True)
class BlocksStored:
    block_hashes: tuple[EngineHash, ...]
    parent_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    # vLLM's per-block extra hash keys (None when not sent); the first block's carries the cache_salt
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    cache_salt: str | None = None  # SGLang's metadata: the salt of every block in the event
    has_lora: bool = False  # blocks of a LoRA adapter (their hashes depend on it, not only on tokens)
    medium: str | None = None  # None: the engine did not say (its GPU cache)
    group_idx: int | None = None  # the KV cache group (hybrid models); None: not sent

    def salt_of_block(self, index: int) -> str | None:
        """The cache_salt that went into block `index`'s hash, as the event tells it: SGLang's
        metadata for every block, vLLM's extra keys for the block that carries one."""
        if self.cache_salt is not None:
            return self.cache_salt
        keys = self.extra_keys[index] if self.extra_keys is not None and index < len(self.extra_keys) else None
        return keys[0] if keys is not None and len(keys) == 1 and isinstance(keys[0], str) else None

    def has_foreign_keys(self, index: int) -> bool:
        """Whether block `index` was hashed with more than its tokens and a salt (images, prompt
        embeddings, LoRA): such a block's identity cannot be rebuilt from its tokens."""
        if self.has_lora:
            return True
        keys = self.extra_keys[index] if self.extra_keys is not None and index < len(self.extra_keys) else None
        return keys is not None and not (len(keys) == 1 and isinstance(keys[0], str))


@dataclass(frozen=True, slots=True)
class BlocksRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


EngineEvent = BlocksStored | BlocksRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[EngineEvent, ...]
    rank: int | None = None
    num_skipped: int = 0  # events not understood


def decode_batch(payload: bytes) -> EventBatch:
    """One message's payload -> its events (those not understood are counted in `num_skipped`)."""
    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    # ValueError: malformed, truncated, extra bytes, too deep, not UTF-8; TypeError: a map keyed by an
    # array or a map; UnpackException: the rest of msgpack's own
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BadEventPayload(f"not a msgpack event batch: {exc}") from exc
    if isinstance(batch, dict):
        batch = [batch.get("ts"), batch.get("events"), batch.get("data_parallel_rank", batch.get("attn_dp_rank"))]
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise BadEventPayload("an event batch is [ts, [events...], rank?]")
    ts = batch[0] if isinstance(batch[0], (int, float)) and not isinstance(batch[0], bool) else 0.0
    rank = batch[2] if len(batch) > 2 and _is_int(batch[2]) else None
    events: list[EngineEvent] = []
    num_skipped = 0
    for raw in batch[1]:
        event = _event(raw)
        if event is None:
            num_skipped += 1
        else:
            events.append(event)
    return EventBatch(float(ts), tuple(events), rank, num_skipped)


def _event(raw: Any) -> EngineEvent | None:
    if isinstance(raw, list) and raw and isinstance(raw[0], str):
        tag, fields, metadata = raw[0], _positional(raw), raw[-1] if isinstance(raw[-1], dict) else None
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str):
        tag, fields, metadata = raw["type"], raw, raw.get("metadata")
    else:
        return None
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if tag == "BlockRemoved":
        hashes = _hashes(fields.get("block_hashes"))
        if hashes is None or not _is_place(fields):
            return None
        return BlocksRemoved(hashes, fields.get("medium"), fields.get("group_idx"))
    if tag == "BlockStored":
        return _stored(fields, metadata)
    return None


def _positional(raw: list[Any]) -> dict[str, Any]:
    """An array-encoded event's fields by name (a trailing map, SGLang's metadata, is not one)."""
    values = raw[1:-1] if isinstance(raw[-1], dict) else raw[1:]
    names = _STORED_FIELDS if raw[0] == "BlockStored" else _REMOVED_FIELDS
    return dict(zip(names, values, strict=False))


def _stored(fields: dict[str, Any], metadata: Any) -> BlocksStored | None:
    hashes = _hashes(fields.get("block_hashes"))
    parent = fields.get("parent_block_hash")
    tokens = fields.get("token_ids")
    block_size = fields.get("block_size")
    if hashes is None or not (parent is None or _is_hash(parent)) or not isinstance(block_size, int) or block_size < 1:
        return None
    if not isinstance(tokens, list) or not all(_is_int(t) and 0 <= t <= MAX_TOKEN_ID for t in tokens):
        return None  # e.g. SGLang's EAGLE pages, whose "tokens" are pairs
    if not _is_place(fields):
        return None
    extra = fields.get("extra_keys")
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    if isinstance(extra, list):
        extra_keys = tuple(tuple(k) if isinstance(k, list) else None if k is None else (k,) for k in extra)
    salt = metadata.get("cache_salt") if isinstance(metadata, dict) else None
    return BlocksStored(
        block_hashes=hashes,
        parent_hash=parent,
        token_ids=tuple(tokens),
        block_size=block_size,
        extra_keys=extra_keys,
        cache_salt=salt if isinstance(salt, str) and salt else None,
        has_lora=fields.get("lora_id") is not None or fields.get("lora_name") is not None,
        medium=fields.get("medium"),
        group_idx=fields.get("group_idx"),
    )


def _hashes(value: Any) -> tuple[EngineHash, ...] | None:
    if not isinstance(value, list) or not all(_is_hash(h) for h in value):
        return None
    return tuple(value)


def _is_hash(value: Any) -> bool:
    return isinstance(value, bytes) or _is_int(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_place(fields: dict[str, Any]) -> bool:
    """Whether the event's cache tier and KV cache group, where sent, are of their types (a string, an
    integer): read otherwise, they would stand for the GPU's cache and group 0."""
    medium, group = fields.get("medium"), fields.get("group_idx")
    return (medium is None or isinstance(medium, str)) and (group is None or _is_int(group))
