from __future__ import annotations

from policies.sim.kv_cache import LRUBlockCache


def test_cached_prefix_counts_leading_blocks_only() -> None:
    cache = LRUBlockCache(10)
    cache.insert((1, 2, 3))
    assert cache.cached_prefix_blocks((1, 2, 3, 4)) == 3
    assert cache.cached_prefix_blocks((1, 9, 3)) == 1
    assert cache.cached_prefix_blocks((2, 3)) == 2  # chain hashes make this impossible in practice
    assert cache.cached_prefix_blocks((7,)) == 0


def test_least_recently_used_request_is_evicted_from_its_tail() -> None:
    cache = LRUBlockCache(5)
    cache.insert((1, 2, 3))
    cache.insert((10, 11))
    cache.insert((20, 21))  # 7 blocks > 5: request (1, 2, 3) loses its tail, 3 then 2
    assert cache.cached_prefix_blocks((1, 2, 3)) == 1
    assert len(cache) == 5 and cache.num_evicted == 2


def test_reuse_refreshes_blocks() -> None:
    cache = LRUBlockCache(4)
    cache.insert((1, 2))
    cache.insert((3, 4))
    cache.insert((1, 2))  # used again: now (3, 4) is the oldest
    cache.insert((5,))
    assert 4 not in cache and 3 in cache and cache.cached_prefix_blocks((1, 2)) == 2


def test_looking_does_not_refresh() -> None:
    cache = LRUBlockCache(2)
    cache.insert((1,))
    cache.insert((2,))
    cache.cached_prefix_blocks((1,))
    cache.insert((3,))
    assert 1 not in cache and 2 in cache
