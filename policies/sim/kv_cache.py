"""A simulated backend's KV cache: a finite set of block hashes evicted least recently used.

`insert` touches a request's blocks from last to first, so its first blocks are the most
recent and eviction eats a prefix from its tail (as vLLM's free-block queue does); evicting a
head first would orphan every block after it.
"""

from __future__ import annotations

from collections import OrderedDict

from policies.sim.trace import leading_hits


class LRUBlockCache:
    def __init__(self, capacity_blocks: int) -> None:
        assert capacity_blocks >= 1
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[int, None] = OrderedDict()  # least recent first
        self.num_evicted = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        """How many leading blocks are cached (no touch: looking is not using)."""
        return leading_hits(block_hashes, self._blocks)

    def insert(self, block_hashes: tuple[int, ...]) -> None:
        blocks = self._blocks
        for h in reversed(block_hashes):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
            self.num_evicted += 1
