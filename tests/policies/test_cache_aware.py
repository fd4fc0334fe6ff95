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
    # b2 is the previous backend: a bit busier than the others and the index has lost its cache
    cands = [cand("b0", load=1000), cand("b1", load=1000, cached=4000), cand("b2", load=1200)]
    info = RouteInfo("t", session_id="s", num_prompt_tokens=5000, previous_backend_id="b2")
    assert pick(CacheAware(eps=0.25), cands, info) == "b2"


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
