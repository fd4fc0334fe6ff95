"""BlockManager on its own: allocation, ref counts, prefix hits, LRU eviction, KV events.

Pure bookkeeping, no model: the engine-level prefix cache behaviour (same tokens when served
from cache) is in test_llm_engine.py with the real model.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from contracts.prefix_hash import block_hash, chain_hashes, salt_root
from engines.builtin.engine.block_manager import BlockManager
from engines.builtin.engine.sequence import Sequence
from engines.sampling_params import SamplingParams

BS = 4


def make_seq(request_id: str, tokens: list[int], salt: str | None = None) -> Sequence:
    return Sequence(request_id, list(tokens), SamplingParams(max_tokens=4), salt)


def compute_all(bm: BlockManager, seq: Sequence) -> None:
    """What the engine does after a step that computed the whole sequence."""
    seq.num_computed_tokens = len(seq)
    bm.commit_computed(seq)


@pytest.mark.process
def test_hashes_are_stable_across_processes_and_salted() -> None:
    tokens = list(range(10))
    here = chain_hashes(tokens, BS, "tenant-a")
    code = "from contracts.prefix_hash import chain_hashes; print(chain_hashes(list(range(10)), 4, 'tenant-a'))"
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert str(here) == there.strip()
    assert len(here) == 2  # only full blocks
    assert here[1] == block_hash(here[0], tokens[4:8])
    assert here[0] == block_hash(salt_root("tenant-a"), tokens[:4])
    assert chain_hashes(tokens, BS, "tenant-b") != here
    assert chain_hashes(tokens, BS, None) != here
    assert all(-(2**63) <= h < 2**63 for h in here)  # signed 64-bit: fits SQLite, numpy int64, JSON


def test_hashes_match_what_the_gateway_computes() -> None:
    from policies.prefix import block_hashes  # the gateway's prefix index hashes the same way

    tokens = list(range(1000, 1037))
    assert chain_hashes(tokens, 16, "tenant-a") == block_hashes(tokens, 16, "tenant-a")


def test_allocate_and_free_returns_every_block() -> None:
    bm = BlockManager(8, BS)
    seq = make_seq("a", range(10))
    assert bm.can_allocate(seq)
    assert bm.allocate(seq) == 0
    assert len(seq.block_table) == 3
    assert bm.num_free_blocks == 5
    bm.deallocate(seq)
    assert bm.num_free_blocks == 8
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_prefix_hit_shares_blocks_and_counts_cached_tokens() -> None:
    bm = BlockManager(16, BS)
    first = make_seq("a", range(13))
    bm.allocate(first)
    compute_all(bm, first)
    second = make_seq("b", list(range(12)) + [99, 98])
    cached = bm.allocate(second)
    assert cached == 12  # three full blocks shared
    assert second.block_table[:3] == first.block_table[:3]
    assert [bm.blocks[b].ref_count for b in first.block_table[:3]] == [2, 2, 2]
    assert second.num_computed_tokens == 12
    bm.deallocate(first)
    bm.deallocate(second)
    assert bm.num_free_blocks == 16
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_last_prompt_token_is_never_served_from_cache() -> None:
    bm = BlockManager(16, BS)
    first = make_seq("a", range(8))
    bm.allocate(first)
    compute_all(bm, first)
    first_table = list(first.block_table)
    bm.deallocate(first)
    again = make_seq("b", range(8))  # exactly two full blocks, both cached
    assert bm.allocate(again) == 4  # the second block is recomputed to get the last token's logits
    assert again.block_table[0] == first_table[0]
    assert again.block_table[1] != first_table[1]  # a fresh block: the cached one is never written


def test_different_salt_never_hits() -> None:
    bm = BlockManager(16, BS)
    first = make_seq("a", range(13), salt="tenant-a")
    bm.allocate(first)
    compute_all(bm, first)
    assert bm.allocate(make_seq("b", range(13), salt="tenant-b")) == 0
    assert bm.allocate(make_seq("c", range(13), salt=None)) == 0
    assert bm.allocate(make_seq("d", range(13), salt="tenant-a")) == 12


def test_hit_checks_tokens_not_only_the_hash() -> None:
    bm = BlockManager(16, BS)
    first = make_seq("a", range(9))
    bm.allocate(first)
    compute_all(bm, first)
    # Corrupt the stored tokens of the first block as a hash collision would look.
    bm.blocks[first.block_table[0]].token_ids = (7, 7, 7, 7)
    assert bm.allocate(make_seq("b", range(9))) == 0


def test_unreferenced_cached_blocks_are_evicted_lru_only_when_needed() -> None:
    bm = BlockManager(6, BS)
    old = make_seq("old", range(9))  # 3 blocks, 2 full + hashed
    bm.allocate(old)
    compute_all(bm, old)
    bm.deallocate(old)
    assert len(bm.hash_to_block) == 2
    assert bm.num_free_blocks == 6  # evictable blocks count as free
    bm.events.drain()
    # Needs 5 blocks: the 4 never-hashed blocks first, then one cached block is evicted.
    big = make_seq("big", range(100, 120))
    bm.allocate(big)
    assert len(bm.hash_to_block) == 1
    removed = [e for e in bm.events.drain() if e.kind == "removed"]
    assert len(removed) == 1
    # The tail of the old chain went first, so its head can still be hit.
    assert removed[0].block_hashes == [chain_hashes(list(range(9)), BS, None)[1]]
    bm.deallocate(big)
    assert bm.allocate(make_seq("again", range(9))) == 4


def test_stored_events_carry_parent_and_tokens() -> None:
    bm = BlockManager(8, BS)
    seq = make_seq("a", range(10), salt="t")
    bm.allocate(seq)
    seq.num_computed_tokens = 5  # a first prefill chunk
    bm.commit_computed(seq)
    seq.num_computed_tokens = 10
    bm.commit_computed(seq)
    events = bm.events.drain()
    hashes = chain_hashes(list(range(10)), BS, "t")
    assert [e.kind for e in events] == ["stored", "stored"]
    assert events[0].block_hashes == [hashes[0]] and events[0].parent_hash == salt_root("t")
    assert events[1].block_hashes == [hashes[1]] and events[1].parent_hash == hashes[0]
    assert events[1].token_ids == [[4, 5, 6, 7]]
    assert events[1].event_id == events[0].event_id + 1
    assert bm.events.drain() == []


def test_may_append_grows_table_and_reports_exhaustion() -> None:
    bm = BlockManager(2, BS)
    seq = make_seq("a", range(4))
    bm.allocate(seq)
    assert bm.may_append(seq, 5)
    assert len(seq.block_table) == 2
    assert not bm.may_append(seq, 9)
    assert len(seq.block_table) == 2
