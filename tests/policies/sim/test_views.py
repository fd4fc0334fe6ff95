from __future__ import annotations

from policies.sim.backend import SimBackend
from policies.sim.kv_cache import LRUBlockCache
from policies.sim.trace import TraceRequest, prepare
from policies.sim.views import ReplicaView, candidates


def test_a_replica_sees_others_blocks_and_load_only_after_it_polls_and_its_own_at_once() -> None:
    backend = SimBackend("b0", LRUBlockCache(2, keep_events=True), prefill_tokens_per_s=1000, decode_tokens_per_s=10)
    mine, theirs = ReplicaView([backend], 0), ReplicaView([backend], 1)
    a, b, c = prepare([TraceRequest(0, 1024, 10, (1, 2)), TraceRequest(100, 512, 10, (7,)), TraceRequest(200, 512, 0, (9,))])
    backend.cache.insert(a.block_hashes, 0.0)
    backend.admit(0.0, 1024, 10, owner=0)
    mine.record(backend, a)
    [seen_by_me] = candidates(mine, a, 0.5, 512)
    [seen_by_them] = candidates(theirs, a, 0.5, 512)
    # 1,024 tokens at 1,000/s: 524 left at 0.5 s
    assert (seen_by_me.cached_prefix_tokens, seen_by_me.in_flight_prefill_tokens) == (1024, 524)
    assert (seen_by_them.cached_prefix_tokens, seen_by_them.in_flight_prefill_tokens) == (0, 0)
    theirs.poll(0.5)
    [polled] = candidates(theirs, a, 0.6, 512)
    assert polled.cached_prefix_tokens == 1024 and polled.in_flight_prefill_tokens == 524  # as of the poll
    # b and c evict a's two blocks (the cache holds 2)
    backend.cache.insert(b.block_hashes, 1.0)
    backend.cache.insert(c.block_hashes, 1.1)
    assert backend.cache.cached_prefix_blocks(a.block_hashes) == 0
    [stale] = candidates(theirs, a, 1.2, 512)
    assert stale.cached_prefix_tokens == 1024  # the eviction is not known until the next poll
    theirs.poll(1.5)
    [fresh] = candidates(theirs, a, 1.5, 512)
    assert fresh.cached_prefix_tokens == 0


def test_a_replica_learns_where_blocks_live_from_each_tier_s_events() -> None:
    region = LRUBlockCache(8, keep_events=True)
    pool = LRUBlockCache(2, keep_events=True, evict_to=LRUBlockCache(4, keep_events=True))
    backend = SimBackend("b0", pool, prefill_tokens_per_s=1000, decode_tokens_per_s=10, region=region)
    other = SimBackend("b1", LRUBlockCache(2, keep_events=True), 1000, 10, region=region)
    a, b = prepare([TraceRequest(0, 1536, 10, (1, 2, 3)), TraceRequest(100, 1024, 10, (7, 8))])
    view = ReplicaView([backend, other], 0)
    backend.store(a.block_hashes, backend.lookup(a.block_hashes), 0.0)  # another replica's request
    backend.store(b.block_hashes, backend.lookup(b.block_hashes), 0.1)  # a's blocks go to the host tier
    [unknown, _] = candidates(view, a, 0.2, 512)
    assert unknown.reusable_prefix_tokens == 0
    view.poll(0.2)
    mine, theirs = candidates(view, a, 0.2, 512)
    assert (mine.cached_prefix_tokens, mine.host_tier_tokens, mine.region_pool_tokens) == (0, 1536, 0)
    assert (theirs.cached_prefix_tokens, theirs.host_tier_tokens, theirs.region_pool_tokens) == (0, 0, 1536)
