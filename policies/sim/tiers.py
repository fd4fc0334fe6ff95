"""The KV tiers under a backend's pool: its host-memory tier and its region's shared pool.

Model (stated once; issue 33):
- A backend's KV pool is an LRU block cache (kv_cache.py). A block the pool evicts goes to the
  backend's host-memory tier, a bounded LRU block cache of its own; what that evicts is gone.
- The regional pool (Mooncake Store-like) is one bounded LRU block cache shared by every backend
  of the region (the simulated fleet is one region). A backend puts each block it prefills there;
  fetching a block counts as using it.
- A lookup (`tier_hits`) takes the longest prefix in the pool, continues it in the host tier,
  then in the regional pool, and prefills the rest. Copied and fetched blocks enter the pool like
  prefilled ones; the host tier keeps its copy.
- Time: a host-tier token costs a host-to-device copy, a regional token a network fetch, each at
  a fixed rate in tokens per second. It is spent in the backend's prefill queue just before the
  request's own prefill (conservative: engines overlap such loads with other requests' compute).

The default rates are for an 8B-class GQA model in bfloat16 (32 layers x 8 KV heads x 128 dims x
K and V x 2 bytes = 128 KiB of KV a token) on one H100, whose prefill the simulator puts at
16,000 tokens/s (SimConfig):
- host copy, 200,000 tokens/s = 26 GB/s: a pinned host-to-device copy over PCIe (Gen4 x16 peaks
  at 32 GB/s, Gen5 at 64), so a copied token costs 0.08 of a prefilled one;
- regional fetch, 90,000 tokens/s = 11.8 GB/s: about one 100 Gb/s RDMA link's payload (Mooncake's
  transfer engine moves blocks over RDMA), so a fetched token costs 0.18 of a prefilled one,
  within the issue's goal for a pool hit (under 0.2x of prefilling).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

HOST_COPY_TOKENS_PER_S = 200_000.0
REGION_FETCH_TOKENS_PER_S = 90_000.0


@dataclass(slots=True, frozen=True)
class TierHits:
    """Where a request's reusable leading blocks are: so many in the pool, then so many in the
    host tier, then so many in the regional pool."""

    pool: int = 0
    host: int = 0
    region: int = 0

    @property
    def blocks(self) -> int:
        return self.pool + self.host + self.region

    def tokens(self, block_size: int, num_prompt_tokens: int) -> tuple[int, int, int]:
        """(pool, host, region) in tokens; the prompt's last, partial block ends at the prompt."""
        ends = [min(n * block_size, num_prompt_tokens) for n in (self.pool, self.pool + self.host, self.blocks)]
        return ends[0], ends[1] - ends[0], ends[2] - ends[1]


def tier_hits(
    block_hashes: tuple[int, ...],
    pool: Container[int],
    host: Container[int] | None = None,
    region: Container[int] | None = None,
) -> TierHits:
    """The longest prefix in `pool`, continued in `host`, then in `region` (None: no such tier)."""
    in_pool = _run(block_hashes, 0, pool)
    in_host = _run(block_hashes, in_pool, host)
    in_region = _run(block_hashes, in_host, region)
    return TierHits(in_pool, in_host - in_pool, in_region - in_host)


def _run(block_hashes: tuple[int, ...], start: int, tier: Container[int] | None) -> int:
    """Where the run of `block_hashes` held by `tier` from `start` on ends."""
    end = start
    if tier is not None:
        while end < len(block_hashes) and block_hashes[end] in tier:
            end += 1
    return end


def parse_size(text: str, pool_blocks: int) -> int:
    """A tier's size in blocks from `N` (blocks) or `Kx` (K times one backend's KV pool); 0 is none."""
    try:
        size = round(float(text[:-1]) * pool_blocks) if text.endswith("x") else int(text)
    except ValueError:
        size = -1
    if size < 0:
        raise ValueError(f"tier size {text!r}: give a number of blocks (e.g. 4096) or a multiple of the pool (e.g. 4x)")
    return size
