from __future__ import annotations

from collections import Counter, deque

import pytest

from policies.base import Candidate, Policy, RouteInfo
from policies.cache_aware import CacheAware
from policies.errors import PolicyConfigError


def pick(policy: Policy, candidates: list[Candidate], info: RouteInfo) -> str:
    choice = policy.select(candidates, info)
    assert choice is not None
    return choice.id


def cand(bid: str, load: int = 0, cached: int = 0, healthy: bool = True) -> Candidate:
    return Candidate(bid, healthy=healthy, in_flight_prefill_tokens=load, cached_prefix_tokens=cached)


def test_prefers_the_backend_holding_the_prefix() -> None:
    cands = [cand("b0", load=500), cand("b1", load=2000, cached=8000), cand("b2")]
    info = RouteInfo("t", session_id="s", num_prompt_tokens=10_000)
    # b1: 2000 to prefill + 2000 in flight = 4000 beats b2: 10000 + 0 and b0: 10000 + 500
    assert pick(CacheAware(), cands, info) == "b1"


def test_load_outweighs_a_small_cached_prefix() -> None:
    cands = [cand("b0", load=50_000, cached=1000), cand("b1", load=0)]
    info = RouteInfo("t", num_prompt_tokens=2000)
    assert pick(CacheAware(), cands, info) == "b1"


def test_session_sticks_to_previous_backend_within_the_bound() -> None:
    # b2 is the previous backend: a bit busier than the others, and the index has lost its cache
    # (it reports b1 holding one 512-token block, a tenth of the prompt: not markedly more)
    cands = [cand("b0", load=1000), cand("b1", load=1000, cached=512), cand("b2", load=1200)]
    info = RouteInfo("t", session_id="s", num_prompt_tokens=5000, previous_backend_id="b2")
    assert pick(CacheAware(eps=0.25), cands, info) == "b2"


def test_previous_backend_loses_to_a_markedly_longer_prefix() -> None:
    # b0 (previous) holds only the shared first block; b1 holds the whole conversation
    cands = [cand("b0", load=1000, cached=512), cand("b1", load=1500, cached=7680), cand("b2", load=1000)]
    info = RouteInfo("t", session_id="s", num_prompt_tokens=8000, previous_backend_id="b0")
    assert pick(CacheAware(), cands, info) == "b1"


def test_previous_backend_wins_when_the_index_knows_nothing() -> None:
    cands = [cand("b0", load=1000), cand("b1", load=900), cand("b2", load=1100)]
    info = RouteInfo("t", session_id="s", num_prompt_tokens=8000, previous_backend_id="b2")
    assert pick(CacheAware(), cands, info) == "b2"


def test_previous_backend_wins_over_a_slightly_longer_prefix() -> None:
    # the index says b1 holds one block more (of 16): not marked, the session's backend stays
    cands = [cand("b0", load=1100, cached=7168), cand("b1", load=900, cached=7680)]
    info = RouteInfo("t", session_id="s", num_prompt_tokens=8192, previous_backend_id="b0")
    assert pick(CacheAware(), cands, info) == "b0"
    assert pick(CacheAware(sticky_margin=0), cands, info) == "b1"


def test_one_session_id_for_everything_cannot_pin_a_backend() -> None:
    """A client sends session id "all" for 400 unrelated conversations, 32 in flight at a time.

    Nothing is cached anywhere (the index knows nothing), so only the per-key bound keeps the
    previous backend from taking everything while it stays under (1 + eps) x the mean."""
    policy = CacheAware()
    ids = [f"b{i}" for i in range(4)]
    in_flight = dict.fromkeys(ids, 0)
    running: deque[tuple[str, RouteInfo]] = deque()
    counts: Counter[str] = Counter()
    previous = None
    for n in range(400):
        info = RouteInfo("acme", session_id="all", request_id=str(n), num_prompt_tokens=1000, previous_backend_id=previous)
        choice = pick(policy, [cand(b, load=in_flight[b]) for b in ids], info)
        counts[choice] += 1
        in_flight[choice] += 1000
        running.append((choice, info))
        previous = choice
        if len(running) > 32:
            done, done_info = running.popleft()
            in_flight[done] -= 1000
            policy.on_complete(done, done_info)
    assert max(counts.values()) <= 0.3 * 400  # a fair share is 25%
    while running:
        done, done_info = running.popleft()
        policy.on_complete(done, done_info)
    assert policy._session_tokens == {} and policy._total_tokens == 0  # nothing leaks


def test_a_session_with_nothing_else_in_flight_still_sticks() -> None:
    policy = CacheAware()
    busy = RouteInfo("t", session_id="other", num_prompt_tokens=50_000)
    pick(policy, [cand("b0"), cand("b1")], busy)  # another key's traffic is in flight
    info = RouteInfo("t", session_id="s", num_prompt_tokens=1000, previous_backend_id="b1")
    assert pick(policy, [cand("b0", load=1000), cand("b1", load=1100)], info) == "b1"


def test_score_of_is_the_cost() -> None:
    info = RouteInfo("t", num_prompt_tokens=4000)
    assert CacheAware().score_of(cand("b0", load=500, cached=1000), info) == 3000 + 500


def test_overloaded_previous_backend_loses_stickiness() -> None:
    cands = [cand("b0", load=10_000), cand("b1", load=1000), cand("b2", load=1000)]
    info = RouteInfo("t", session_id="s", num_prompt_tokens=5000, previous_backend_id="b0")
    # mean 4000, bound 5000 < 10000: fall back to cost, where b1/b2 are cheaper
    assert pick(CacheAware(eps=0.25), cands, info) in {"b1", "b2"}


def test_overloaded_previous_backend_can_still_win_on_cost() -> None:
    # past the bound, but re-prefilling 60k tokens elsewhere costs more than its queue
    cands = [cand("b0", load=10_000, cached=60_000), cand("b1", load=1000), cand("b2", load=1000)]
    info = RouteInfo("t", session_id="s", num_prompt_tokens=61_000, previous_backend_id="b0")
    assert pick(CacheAware(eps=0.25), cands, info) == "b0"


def test_unhealthy_previous_backend_is_skipped() -> None:
    cands = [cand("b0", healthy=False, cached=9000), cand("b1", load=10), cand("b2", load=20)]
    info = RouteInfo("t", session_id="s", num_prompt_tokens=10_000, previous_backend_id="b0")
    assert pick(CacheAware(), cands, info) == "b1"


def test_no_healthy_backend_gives_none() -> None:
    info = RouteInfo("t", session_id="s", previous_backend_id="b0")
    assert CacheAware().select([cand("b0", healthy=False), cand("b1", healthy=False)], info) is None


def test_cache_misses_go_to_the_least_loaded_backend() -> None:
    cands = [cand("b0", load=500), cand("b1", load=100), cand("b2", load=300)]
    assert pick(CacheAware(), cands, RouteInfo("t", num_prompt_tokens=4000)) == "b1"


def test_cache_misses_with_equal_load_spread_by_hash_not_first_candidate() -> None:
    policy = CacheAware()
    cands = [cand(f"b{i}") for i in range(4)]
    counts = Counter(
        pick(policy, cands, RouteInfo("t", session_id=f"s{i}", num_prompt_tokens=1000))
        for i in range(400)
    )
    assert set(counts) == {"b0", "b1", "b2", "b3"} and max(counts.values()) < 150


def test_equal_cost_ties_go_to_lower_load() -> None:
    # b0: 1000 to prefill + 1000 load; b1: 2000 to prefill + 0 load -> same cost, b1 less loaded
    cands = [cand("b0", load=1000, cached=1000), cand("b1")]
    assert pick(CacheAware(), cands, RouteInfo("t", num_prompt_tokens=2000)) == "b1"


def test_shared_system_prompt_does_not_pin_all_sessions() -> None:
    """200 new sessions share a 2,048-token system prompt, first cached on b0 only.

    A tiny caller loop: it records in-flight tokens of the chosen backend, marks the prompt as
    cached there, and finishes requests in arrival order with 16 in flight at a time.
    """
    policy = CacheAware()
    ids = [f"b{i}" for i in range(4)]
    in_flight = dict.fromkeys(ids, 0)
    holds_prompt = {"b0"}
    running: deque[tuple[str, int]] = deque()
    counts: Counter[str] = Counter()
    for s in range(200):
        cands = [cand(b, load=in_flight[b], cached=2048 if b in holds_prompt else 0) for b in ids]
        # every new session has its own id; the shared prompt is not a session
        choice = policy.select(cands, RouteInfo("acme", session_id=f"s{s}", num_prompt_tokens=2560))
        assert choice is not None
        counts[choice.id] += 1
        cost = 2560 - choice.cached_prefix_tokens
        in_flight[choice.id] += cost
        running.append((choice.id, cost))
        holds_prompt.add(choice.id)
        if len(running) > 16:
            done, tokens = running.popleft()
            in_flight[done] -= tokens
    assert set(counts) == set(ids)
    assert max(counts.values()) <= 0.4 * 200  # a fair share is 25%


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(PolicyConfigError):
        CacheAware(load_weight=-1)


def test_own_pool_beats_host_tier_beats_regional_pool_beats_miss() -> None:
    info = RouteInfo("t", request_id="r", num_prompt_tokens=10_000)
    cands = [
        Candidate("miss", in_flight_prefill_tokens=100),
        Candidate("region", in_flight_prefill_tokens=100, region_pool_tokens=8000),
        Candidate("host", in_flight_prefill_tokens=100, host_tier_tokens=8000),
        Candidate("pool", in_flight_prefill_tokens=100, cached_prefix_tokens=8000),
    ]
    for expected in ("pool", "host", "region", "miss"):
        assert pick(CacheAware(), cands, info) == expected
        cands = [c for c in cands if c.id != expected]


def test_a_prefix_in_the_regional_pool_frees_the_choice_to_the_least_loaded() -> None:
    info = RouteInfo("t", request_id="r", num_prompt_tokens=10_000)
    holder = cand("b0", load=5000, cached=8000)  # 2000 to prefill + 5000 in flight = 7000
    # with the prefix in the region: 2000 + 0.2 x 8000 fetched + 0 in flight = 3600
    assert pick(CacheAware(), [holder, Candidate("b1", region_pool_tokens=8000)], info) == "b1"
    assert pick(CacheAware(), [holder, cand("b1")], info) == "b0"  # without: 10000 to prefill there


def test_a_session_stays_where_its_host_tier_holds_its_prefix() -> None:
    # b0 (previous) has the conversation in its host tier, b1 in its pool: 0.1 x 8000 = 800 tokens
    # apart, under the sticky margin (2,500); as a miss on b0 it would be 8,000 apart and move
    cands = [Candidate("b0", in_flight_prefill_tokens=1000, host_tier_tokens=8000), cand("b1", load=900, cached=8000)]
    info = RouteInfo("t", session_id="s", num_prompt_tokens=10_000, previous_backend_id="b0")
    assert pick(CacheAware(), cands, info) == "b0"
    assert pick(CacheAware(), [cand("b0", load=1000), cands[1]], info) == "b1"
