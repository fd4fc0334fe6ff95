"""The host-memory tier below the KV pool: blocks the pool evicts, kept in an LRU of bounded size.

When the block manager must reuse a cached block that nobody references, it copies the block's KV
here first (`save`); a later lookup that misses the pool but finds the next blocks of its chain
here copies them back into fresh pool blocks (`load`) instead of prefilling them. A block is in
the pool or in the tier, never both: a load takes it out. Blocks fetched from the region's pool
(backends/server/region_pool.py) land here too (`insert`), so the engine reads one tier below its
pool whatever filled it.

Entries are keyed by the block's chain hash and carry its tokens (checked on a hit, like the
pool's) and its parent hash (so its events can be re-hashed). `storage_dtype` float16 halves the
bytes of a float32 cache: K and V are rounded to float16 (relative error <= 2^-11), so outputs
after a hit are the model's within that rounding, no longer bit for bit; the cache's own dtype
(the default) keeps them exact.

Only blocks with no references are ever saved (the pool evicts only those), so a running or pinned
block never enters the tier. Owned by the engine thread, like the block manager.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import torch
from torch import Tensor

from engines.base import KVTierCounters


@dataclass(slots=True, frozen=True)
class TierBlock:
    hash: int
    parent_hash: int | None
    token_ids: tuple[int, ...]
    data: Tensor  # [num_layers, block_size, 2, kv_heads, head_dim] in the storage dtype

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()


class KVBlockIO:
    """Copies one block of every layer out of the paged cache and back."""

    def __init__(self, caches: list[Tensor]) -> None:
        self.caches = caches

    @property
    def dtype(self) -> torch.dtype:
        return self.caches[0].dtype

    def read(self, block_id: int, dtype: torch.dtype) -> Tensor:
        return torch.stack([cache[block_id] for cache in self.caches]).to(dtype)

    def write(self, block_id: int, data: Tensor) -> None:
        for cache, layer in zip(self.caches, data, strict=True):
            cache[block_id].copy_(layer)  # converts a float16 copy back to the cache's dtype


class HostTier:
    def __init__(self, io: KVBlockIO, capacity_blocks: int, storage_dtype: torch.dtype | None = None) -> None:
        if capacity_blocks < 1:
            raise ValueError("a host tier needs capacity_blocks >= 1")
        self.io = io
        self.storage_dtype = storage_dtype or io.dtype
        self.entries: OrderedDict[int, TierBlock] = OrderedDict()  # oldest first
        self.counters = KVTierCounters(capacity_blocks=capacity_blocks)

    @property
    def capacity_blocks(self) -> int:
        return self.counters.capacity_blocks

    def __len__(self) -> int:
        return len(self.entries)

    def find(self, block_hash: int, token_ids: list[int] | tuple[int, ...]) -> TierBlock | None:
        """The entry holding this block (tokens checked), without counting or reordering."""
        entry = self.entries.get(block_hash)
        return entry if entry is not None and entry.token_ids == tuple(token_ids) else None

    def touch(self, block_hash: int) -> None:
        """Make the entry under `block_hash` (if any) the most recent."""
        if block_hash in self.entries:
            self.entries.move_to_end(block_hash)

    def save(self, block_id: int, block_hash: int, parent_hash: int | None, token_ids: tuple[int, ...]) -> list[int]:
        """Copy pool block `block_id` in; returns the hashes of the entries this pushed out."""
        started = time.perf_counter()
        entry = TierBlock(block_hash, parent_hash, token_ids, self.io.read(block_id, self.storage_dtype))
        self.counters.seconds += time.perf_counter() - started
        return self.insert(entry)

    def insert(self, entry: TierBlock) -> list[int]:
        """Keep `entry` as the most recent; returns the hashes of the entries this pushed out."""
        self.entries.pop(entry.hash, None)
        self.entries[entry.hash] = entry
        c = self.counters
        c.num_stored_blocks += 1
        c.num_bytes_in += entry.nbytes
        dropped = []
        while len(self.entries) > c.capacity_blocks:
            old_hash, _ = self.entries.popitem(last=False)
            dropped.append(old_hash)
        c.num_evicted_blocks += len(dropped)
        c.num_blocks = len(self.entries)
        return dropped

    def load(self, entry: TierBlock, block_id: int) -> None:
        """Copy `entry` into pool block `block_id` and drop it from the tier (the pool holds it now).
        `entry` may have left the tier since it was found: its tensor is still whole."""
        started = time.perf_counter()
        self.io.write(block_id, entry.data)
        c = self.counters
        c.seconds += time.perf_counter() - started
        if self.entries.get(entry.hash) is entry:
            del self.entries[entry.hash]
        c.num_hit_blocks += 1
        c.num_bytes_out += entry.nbytes
        c.num_blocks = len(self.entries)

    def count_misses(self, num_blocks: int) -> None:
        self.counters.num_miss_blocks += num_blocks

    def snapshot(self) -> KVTierCounters:
        c = self.counters
        return KVTierCounters(
            c.capacity_blocks, len(self.entries), c.num_hit_blocks, c.num_miss_blocks, c.num_stored_blocks,
            c.num_evicted_blocks, c.num_bytes_in, c.num_bytes_out, c.seconds,
        )
