"""Decoding vLLM's and SGLang's KV event batches (recorded in tests/backends/fixtures/kv_events)."""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest

from backends.client.engine_events import (
    AllBlocksCleared,
    BadEventPayload,
    BlocksRemoved,
    BlocksStored,
    decode_batch,
)

FIXTURES = Path(__file__).parent / "fixtures" / "kv_events"
SALT = "salt-tenant-a"


def recorded(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def test_vllm_field_maps_decode_with_their_salt_and_bytes_hashes() -> None:
    batch = decode_batch(recorded("vllm_0_32_map.msgpack"))
    first, child, removed, cleared = batch.events
    assert (batch.ts, batch.rank, batch.num_skipped) == (1.5, 0, 0)
    assert isinstance(first, BlocksStored)
    assert first.block_hashes == (b"\x01" * 32, b"\x02" * 32) and first.parent_hash is None
    assert first.token_ids == tuple(range(100, 132)) and first.block_size == 16
    assert (first.medium, first.group_idx, first.has_lora) == ("GPU", 0, False)
    assert first.salt_of_block(0) == SALT and first.salt_of_block(1) is None
    assert not first.has_foreign_keys(0) and not first.has_foreign_keys(1)
    assert isinstance(child, BlocksStored) and child.parent_hash == b"\x02" * 32 and child.salt_of_block(0) is None
    assert removed == BlocksRemoved((b"\x03" * 32,), "GPU", 0)
    assert cleared == AllBlocksCleared()


def test_vllm_positional_arrays_decode() -> None:
    batch = decode_batch(recorded("vllm_array.msgpack"))
    first, removed, cleared = batch.events
    assert isinstance(first, BlocksStored)
    assert first.block_hashes == (11, 12) and first.token_ids == tuple(range(100, 132)) and first.medium == "GPU"
    assert first.extra_keys is None and first.salt_of_block(0) is None  # this version sent no salt
    assert removed == BlocksRemoved((12,), "GPU")
    assert cleared == AllBlocksCleared()


def test_sglang_metadata_salts_every_block_of_its_event() -> None:
    batch = decode_batch(recorded("sglang_array.msgpack"))
    salted, plain, removed, cleared = batch.events
    assert isinstance(salted, BlocksStored) and isinstance(plain, BlocksStored)
    assert salted.block_hashes == (-5, 6) and salted.block_size == 1 and salted.token_ids == (100, 101)
    assert salted.salt_of_block(0) == SALT and salted.salt_of_block(1) == SALT
    assert plain.parent_hash == 6 and plain.salt_of_block(0) is None
    assert removed == BlocksRemoved((7,), "GPU")
    assert cleared == AllBlocksCleared()


def test_what_is_not_understood_is_counted_not_guessed() -> None:
    events = [
        ["BlockStored", [1], None, [[1, 2]], 2, None],  # SGLang EAGLE pages: token pairs
        ["BlockStored", ["not a hash"], None, [1], 1, None],
        {"type": "SomethingNew", "x": 1},
        ["AllBlocksCleared"],
        ["BlockStored", [9], None, [1, 2], 2, None, "GPU", "adapter", None],  # a LoRA's block
    ]
    batch = decode_batch(msgpack.packb([0.0, events]))
    assert batch.num_skipped == 3
    assert batch.events[0] == AllBlocksCleared()
    lora = batch.events[1]
    assert isinstance(lora, BlocksStored) and lora.has_lora and lora.has_foreign_keys(0)


def test_image_keys_make_a_block_foreign() -> None:
    stored = ["BlockStored", [1, 2], None, [1, 2, 3, 4], 2, None, "GPU", None, [["salt", ["img-uuid", 0]], None]]
    (event,) = decode_batch(msgpack.packb([0.0, [stored]])).events
    assert isinstance(event, BlocksStored)
    assert event.has_foreign_keys(0) and event.salt_of_block(0) is None and not event.has_foreign_keys(1)


def test_fields_of_the_wrong_type_or_range_skip_their_event() -> None:
    """A token id outside int32 (the prefix chain packs them as int32) raised in the index and ended
    the subscription; a medium or cache group of another type was read as the GPU's, group 0."""
    events = [
        {"type": "BlockStored", "block_hashes": [1], "token_ids": [2**31], "block_size": 1},
        {"type": "BlockStored", "block_hashes": [2], "token_ids": [-1], "block_size": 1},
        {"type": "BlockStored", "block_hashes": [3], "token_ids": [7], "block_size": 1, "medium": 5},
        {"type": "BlockStored", "block_hashes": [4], "token_ids": [7], "block_size": 1, "group_idx": "0"},
        {"type": "BlockRemoved", "block_hashes": [5], "medium": ["GPU"]},
        {"type": "BlockStored", "block_hashes": [6], "token_ids": [2**31 - 1], "block_size": 1, "medium": "GPU"},
    ]
    batch = decode_batch(msgpack.packb([0.0, events]))
    assert batch.num_skipped == 5
    (kept,) = batch.events
    assert isinstance(kept, BlocksStored) and kept.token_ids == (2**31 - 1,)


@pytest.mark.parametrize("payload", [
    b"\xc1", msgpack.packb({"no": "batch"}), msgpack.packb([1.0, "x"]),
    b"\x92\x00\x91\x81\x90\x00",  # a map keyed by an array: msgpack raised TypeError, past the subscriber
    b"\x92\x00\x91\xa2\xff\xfe",  # a string that is not UTF-8
])
def test_a_payload_that_is_no_batch_raises(payload: bytes) -> None:
    with pytest.raises(BadEventPayload):
        decode_batch(payload)


def recorded_vllm() -> dict:
    """Messages a real vLLM 0.32.0 (CPU build, --block-size 32) published for one 70-token prompt
    sent with cache_salt "salt-tenant-a", then "salt-tenant-b", "salt-tenant-a" again (a cache hit:
    no new blocks) and no salt; and its replay socket's answer to "from seq 1"
    (tests/backends/fixtures/kv_events/README.md)."""
    return msgpack.unpackb(recorded("vllm_0_32_recorded.msgpack"))


def test_real_vllm_messages_decode() -> None:
    live = recorded_vllm()["live"]
    assert [(topic, int.from_bytes(seq, "big")) for topic, seq, _ in live] == [(b"", 0), (b"", 1), (b"", 2)]
    salts = []
    for _, _, payload in live:
        batch = decode_batch(payload)
        (event,) = batch.events
        assert isinstance(event, BlocksStored) and batch.rank == 0 and batch.num_skipped == 0
        assert event.token_ids == tuple(range(1000, 1064)) and event.block_size == 32 and event.parent_hash is None
        assert all(isinstance(h, int) and h >= 0 for h in event.block_hashes) and len(event.block_hashes) == 2
        salts.append(event.salt_of_block(0))
    assert salts == ["salt-tenant-a", "salt-tenant-b", None]
