"""Paged KV cache bookkeeping: block allocation, reference counts and the prefix cache.

The cache is `num_blocks` fixed-size blocks of `block_size` token slots. A sequence owns a
block table (physical block ids covering its positions). Full blocks whose KV has been computed
are registered under their chained, tenant-salted hash (see `contracts.prefix_hash`); a later sequence of
the same tenant whose prompt starts with the same blocks reuses them (tokens checked on a hit)
instead of computing them again. Shared blocks are reference-counted. A block nobody references
but that still holds a cached prefix sits in an LRU list and is only evicted (its hash dropped,
a "removed" event emitted) when no plain free block is left.

With a host tier (host_tier.py) an evicted block's KV is copied there first, and a prefix that
runs on past the pool's hits into the tier is copied back into fresh blocks at allocation, so the
sequence starts computed past them too. Events say where each block went (`medium`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

import torch

from contracts.kv_events import MEDIUM_HOST
from contracts.prefix_hash import block_hash, salt_root
from engines.builtin.engine.host_tier import HostTier, KVBlockIO, TierBlock
from engines.builtin.engine.kv_events import KVEventLog
from engines.builtin.engine.sequence import Sequence


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set while the block is registered in the prefix cache
    token_ids: tuple[int, ...] | None = None
    parent_hash: int | None = None  # the chain hash before it (its salt's root for a first block)


@dataclass(slots=True)
class PrefixMatch:
    """The head of a sequence found cached: blocks in the pool, then the next ones in the host tier."""

    block_ids: list[int]
    hashes: list[int]
    tier_blocks: list[TierBlock]
    num_missed: int  # full blocks (within the lookup's limit) past both

    @property
    def num_blocks(self) -> int:
        return len(self.block_ids) + len(self.tier_blocks)


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, events: KVEventLog | None = None, host_tier: HostTier | None = None,
    ) -> None:
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; oldest first
        self.hash_to_block: dict[int, int] = {}
        self.events = events if events is not None else KVEventLog()
        self.host_tier = host_tier

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: never-used/freed ones plus evictable cached ones."""
        return len(self.free_block_ids) + len(self.evictable)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix matching -------------------------------------------------------------------

    def _match_prefix(self, seq: Sequence) -> PrefixMatch:
        return self.match(seq.token_ids, seq.cache_salt)

    def match(self, token_ids: list[int], cache_salt: str | None) -> PrefixMatch:
        """Cached blocks that hold the head of a sequence: the pool's, then the host tier's, stopping
        at the first block neither holds.

        At most (len - 1) // block_size blocks: the last token is always computed so the model
        produces logits for it.
        """
        match = PrefixMatch([], [], [], 0)
        parent = salt_root(cache_salt)
        bs = self.block_size
        limit = (len(token_ids) - 1) // bs
        for i in range(limit):
            tokens = token_ids[i * bs : (i + 1) * bs]
            h = block_hash(parent, tokens)
            block_id = self.hash_to_block.get(h)
            if block_id is not None and self.blocks[block_id].token_ids == tuple(tokens) and not match.tier_blocks:
                match.block_ids.append(block_id)
                match.hashes.append(h)
            else:
                entry = None
                if self.host_tier is not None and block_id is None:
                    entry = self.host_tier.find(h, tokens)
                if entry is None:
                    match.num_missed = limit - i
                    break
                match.tier_blocks.append(entry)
            parent = h
        return match

    def can_allocate(self, seq: Sequence) -> bool:
        match = self._match_prefix(seq)
        num_new = self.num_blocks_for(len(seq)) - len(match.block_ids)
        num_revived = sum(1 for b in match.block_ids if self.blocks[b].ref_count == 0)
        return num_new + num_revived <= self.num_free_blocks

    def allocate(self, seq: Sequence) -> int:
        """Give `seq` blocks for all its tokens, reusing cached ones (the host tier's copied back);
        returns the cached token count."""
        assert not seq.block_table, f"{seq.request_id} already holds blocks"
        match = self._match_prefix(seq)
        for block_id in match.block_ids:  # take the hits first so taking new blocks cannot evict them
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.evictable[block_id]
            block.ref_count += 1
        seq.block_table = list(match.block_ids)
        seq.block_hashes = list(match.hashes)
        for entry in match.tier_blocks:  # each found entry holds its tensor even if the tier drops it meanwhile
            block_id = self._take_free_block()
            assert self.host_tier is not None
            self.host_tier.load(entry, block_id)
            self.events.removed([entry.hash], MEDIUM_HOST)
            self._register(block_id, entry.hash, entry.parent_hash, entry.token_ids)
            self.events.stored([entry.hash], entry.parent_hash, [list(entry.token_ids)])
            seq.block_table.append(block_id)
            seq.block_hashes.append(entry.hash)
        if self.host_tier is not None:
            self.host_tier.count_misses(match.num_missed)
        for _ in range(self.num_blocks_for(len(seq)) - match.num_blocks):
            seq.block_table.append(self._take_free_block())
        seq.num_computed_tokens = match.num_blocks * self.block_size
        return seq.num_computed_tokens

    def may_append(self, seq: Sequence, num_tokens: int) -> bool:
        """Grow the block table to cover `num_tokens` positions; False if blocks ran out."""
        num_new = self.num_blocks_for(num_tokens) - len(seq.block_table)
        if num_new > self.num_free_blocks:
            return False
        for _ in range(num_new):
            seq.block_table.append(self._take_free_block())
        return True

    def deallocate(self, seq: Sequence) -> None:
        self.release(seq.block_table)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed_tokens = 0

    def release(self, block_ids: list[int]) -> None:
        """Drop one reference to each block (a sequence's table, or a KV pin's blocks)."""
        # Tail first, so the LRU evicts a chain's last blocks before its shared head.
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {block_id} released twice"
            if block.ref_count == 0:
                if block.hash is not None:
                    self.evictable[block_id] = None
                else:
                    self.free_block_ids.append(block_id)

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Release the blocks of `seq` beyond those covering positions [0, num_tokens): the slots
        of rejected draft tokens. Never a registered block: those hold computed tokens only."""
        keep = self.num_blocks_for(num_tokens)
        assert keep >= len(seq.block_hashes), f"{seq.request_id}: trimming a registered block"
        self.release(seq.block_table[keep:])
        del seq.block_table[keep:]

    # ---- registering computed blocks -------------------------------------------------------

    def commit_computed(self, seq: Sequence) -> None:
        """Register the full blocks of `seq` whose KV is now computed in the prefix cache."""
        bs = self.block_size
        num_full = seq.num_computed_tokens // bs
        if len(seq.block_hashes) >= num_full:
            return
        parent = seq.block_hashes[-1] if seq.block_hashes else salt_root(seq.cache_salt)
        run_hashes: list[int] = []
        run_tokens: list[list[int]] = []
        run_parent = parent
        for i in range(len(seq.block_hashes), num_full):
            tokens = seq.token_ids[i * bs : (i + 1) * bs]
            h = block_hash(parent, tokens)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            if h in self.hash_to_block:
                # Same content already cached in another block (computed concurrently): keep that
                # one; this block stays private and is freed normally.
                if run_hashes:
                    self.events.stored(run_hashes, run_parent, run_tokens)
                run_parent, run_hashes, run_tokens = h, [], []
            else:
                self._register(block.block_id, h, parent, tuple(tokens))
                run_hashes.append(h)
                run_tokens.append(list(tokens))
            parent = h
        if run_hashes:
            self.events.stored(run_hashes, run_parent, run_tokens)

    def _register(self, block_id: int, h: int, parent: int | None, token_ids: tuple[int, ...]) -> None:
        block = self.blocks[block_id]
        block.hash, block.parent_hash, block.token_ids = h, parent, token_ids
        self.hash_to_block[h] = block_id

    def _take_free_block(self) -> int:
        if self.free_block_ids:
            return self._claim(self.free_block_ids.popleft())
        block_id, _ = self.evictable.popitem(last=False)  # least recently released
        block = self.blocks[block_id]
        assert block.hash is not None and block.token_ids is not None, "only hashed blocks are evictable"
        del self.hash_to_block[block.hash]
        self.events.removed([block.hash])
        if self.host_tier is not None:  # down a tier rather than gone
            dropped = self.host_tier.save(block_id, block.hash, block.parent_hash, block.token_ids)
            self.events.stored([block.hash], block.parent_hash, [list(block.token_ids)], MEDIUM_HOST)
            if dropped:
                self.events.removed(dropped, MEDIUM_HOST)
        block.hash, block.parent_hash, block.token_ids = None, None, None
        return self._claim(block_id)

    # ---- the tiers below -------------------------------------------------------------------

    def admit_fetched(self, entries: list[TierBlock], keep: tuple[int, ...] | list[int] = ()) -> int:
        """Blocks fetched from elsewhere (the region's pool) go into the host tier, unless the pool
        holds them already; returns how many went in. The tier entries under `keep` (the same
        prompt's, found before the fetch) become the most recent first, so these cannot push them out."""
        if self.host_tier is None:
            return 0
        for h in keep:
            self.host_tier.touch(h)
        admitted, dropped = [], []
        for entry in entries:
            if entry.hash not in self.hash_to_block:
                dropped += self.host_tier.insert(entry)
                admitted.append(entry)
        self.events.stored_chain(admitted, MEDIUM_HOST)
        if dropped:
            self.events.removed(dropped, MEDIUM_HOST)
        return len(admitted)

    def read_blocks(self, hashes: list[int], io: KVBlockIO, dtype: torch.dtype) -> list[TierBlock]:
        """Copies of the blocks under `hashes` that the pool or the host tier holds (to share them)."""
        out = []
        for h in hashes:
            block_id = self.hash_to_block.get(h)
            if block_id is not None:
                block = self.blocks[block_id]
                assert block.token_ids is not None
                out.append(TierBlock(h, block.parent_hash, block.token_ids, io.read(block_id, dtype)))
            elif self.host_tier is not None and h in self.host_tier.entries:
                entry = self.host_tier.entries[h]
                out.append(entry if entry.data.dtype == dtype else
                           TierBlock(h, entry.parent_hash, entry.token_ids, entry.data.to(dtype)))
        return out

    def _claim(self, block_id: int) -> int:
        block = self.blocks[block_id]
        assert block.ref_count == 0
        block.ref_count = 1
        return block_id
