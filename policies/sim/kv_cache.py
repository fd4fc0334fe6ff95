"""A simulated backend's KV cache: a finite set of block hashes evicted least recently used.

`insert` touches a request's blocks from last to first, so its first blocks are the most
recent and eviction eats a prefix from its tail (as vLLM's free-block queue does); evicting a
head first would orphan every block after it.

With `keep_events`, the cache also logs what a backend's `/kv_cache_events` would report: one
`(time, stored, block hash)` per block newly stored (`stored` True) or evicted (False), in order.
Gateways in the replay read that log with a delay (views.py).

With `evict_to`, an evicted block is not lost but inserted into that cache, the tier below (a
backend's host-memory tier under its KV pool: tiers.py).
"""

from __future__ import annotations

from collections import OrderedDict

from policies.sim.trace import leading_hits

KVEvent = tuple[float, bool, int]  # (time, stored, block hash)


class LRUBlockCache:
    def __init__(self, capacity_blocks: int, keep_events: bool = False, evict_to: LRUBlockCache | None = None) -> None:
        assert capacity_blocks >= 1
        self.capacity_blocks = capacity_blocks
        self.evict_to = evict_to
        self._blocks: OrderedDict[int, None] = OrderedDict()  # least recent first
        self.num_evicted = 0
        self.keep_events = keep_events
        self.events: list[KVEvent] = []

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    def cached_prefix_blocks(self, block_hashes: tuple[int, ...]) -> int:
        """How many leading blocks are cached (no touch: looking is not using)."""
        return leading_hits(block_hashes, self._blocks)

    def insert(self, block_hashes: tuple[int, ...], now: float = 0.0) -> None:
        blocks = self._blocks
        for h in reversed(block_hashes):
            if h in blocks:
                blocks.move_to_end(h)
            else:
                blocks[h] = None
                if self.keep_events:
                    self.events.append((now, True, h))
        while len(blocks) > self.capacity_blocks:
            evicted, _ = blocks.popitem(last=False)
            self.num_evicted += 1
            if self.keep_events:
                self.events.append((now, False, evicted))
            if self.evict_to is not None:
                self.evict_to.insert((evicted,), now)
