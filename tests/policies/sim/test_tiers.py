"""The KV tiers under a backend's pool (policies/sim/tiers.py) and how a backend uses them."""

from __future__ import annotations

import pytest

from policies.sim.backend import SimBackend
from policies.sim.kv_cache import LRUBlockCache
from policies.sim.tiers import TierHits, parse_size, tier_hits


def test_blocks_evicted_from_the_pool_go_to_the_host_tier_which_is_bounded() -> None:
    host = LRUBlockCache(3)
    pool = LRUBlockCache(2, evict_to=host)
    pool.insert((1, 2))
    pool.insert((3,))  # evicts 2 (the tail of the older request) into the host tier
    assert 2 not in pool and 2 in host and len(host) == 1
    pool.insert((4, 5))  # evicts 1 then 3
    assert all(h in host for h in (2, 1, 3)) and len(host) == 3
    pool.insert((6, 7))  # evicts 5 then 4: the host tier keeps 3 blocks, its least recent (2, 1) go
    assert len(pool) == 2 and len(host) == 3 and host.num_evicted == 2
    assert 2 not in host and 1 not in host and all(h in host for h in (3, 4, 5))


def test_a_lookup_takes_the_pool_then_the_host_tier_then_the_region() -> None:
    pool, host, region = {1}, {2, 3, 9}, {4, 9}
    assert tier_hits((1, 2, 3, 4, 5), pool, host, region) == TierHits(1, 2, 1)
    assert tier_hits((1, 2, 3, 4, 9), pool, host, region) == TierHits(1, 2, 2)
    # the order is strict: a run in the region does not go back to the host tier
    assert tier_hits((4, 2), pool, host, region) == TierHits(0, 0, 1)
    assert tier_hits((1, 2), pool, None, region) == TierHits(1, 0, 0)  # no host tier
    assert tier_hits((7, 1), pool, host, region) == TierHits()


def test_tier_hits_in_tokens_end_at_the_prompt() -> None:
    assert TierHits(1, 1, 2).tokens(512, 4 * 512 - 100) == (512, 512, 924)
    assert TierHits(2, 0, 0).tokens(512, 700) == (700, 0, 0)
    assert TierHits(1, 1, 2).blocks == 4


def tiered_backend(region: LRUBlockCache) -> SimBackend:
    pool = LRUBlockCache(2, evict_to=LRUBlockCache(4))
    return SimBackend("b0", pool, 1000.0, 10.0, region=region, host_copy_tokens_per_s=10_000.0,
                      region_fetch_tokens_per_s=4000.0)


def test_a_backend_puts_what_it_prefills_in_the_region_and_copies_back_from_its_host_tier() -> None:
    region = LRUBlockCache(8, keep_events=True)
    b = tiered_backend(region)
    first = (1, 2, 3)
    hits = b.lookup(first)
    assert hits == TierHits()
    b.store(first, hits, 0.0)  # the pool keeps 2 blocks: 3 goes to the host tier
    assert len(region) == 3 and all(h in region for h in first) and b.host is not None and 3 in b.host
    assert b.lookup((1, 2, 3, 4)) == TierHits(2, 1, 0)
    other = tiered_backend(region)  # another backend of the region finds them in the regional pool
    hits = other.lookup((1, 2, 3, 4))
    assert hits == TierHits(0, 0, 3)
    other.store((1, 2, 3, 4), hits, 1.0)
    assert [h for _, stored, h in region.events if stored] == [3, 2, 1, 4]  # 4 is new; 1-3 are only used
    assert b.fetch_seconds(1000, 2000) == pytest.approx(0.1 + 0.5)


def test_copies_and_fetches_wait_in_the_prefill_queue_and_count_as_load() -> None:
    b = tiered_backend(LRUBlockCache(8))
    # 500 tokens to prefill at 1,000/s after a 0.5 s fetch: first token at 1.0 s
    assert b.admit(0.0, 500, 10, fetch_s=0.5) == pytest.approx(1.0)
    assert b.in_flight(0.0) == (1000, 10)  # the fetch counts as 500 prefill tokens' time
    assert b.in_flight(0.5) == (500, 10)
    assert b.admit(0.0, 1000, 0) == pytest.approx(2.0)  # queued behind the fetch and the prefill
    assert b.num_prefilled_tokens == 1500  # work is what was computed


def test_tier_sizes_are_blocks_or_multiples_of_the_pool() -> None:
    assert [parse_size(text, 745) for text in ("4096", "0", "2x", "0.5x")] == [4096, 0, 1490, 372]
    for bad in ("-1", "x", "2y", "-2x"):
        with pytest.raises(ValueError, match="a multiple of the pool"):
            parse_size(bad, 745)
