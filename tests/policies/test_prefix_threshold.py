from __future__ import annotations

import pytest

from policies.base import Candidate, RouteInfo
from policies.errors import PolicyConfigError
from policies.factory import build_policy
from policies.prefix_threshold import PrefixThreshold


def cand(bid: str, load: int = 0, cached: int = 0) -> Candidate:
    return Candidate(bid, in_flight_prefill_tokens=load, cached_prefix_tokens=cached)


def pick(policy: PrefixThreshold, candidates: list[Candidate], info: RouteInfo) -> str:
    choice = policy.select(candidates, info)
    assert choice is not None
    return choice.id


INFO = RouteInfo("t", session_id="s", num_prompt_tokens=10_000)


def test_longest_prefix_over_half_the_prompt_wins_when_balanced() -> None:
    cands = [cand("b0", load=8000, cached=6000), cand("b1", load=7000, cached=2000), cand("b2", load=7500)]
    assert pick(PrefixThreshold(), cands, INFO) == "b0"


def test_a_prefix_under_half_the_prompt_goes_to_the_least_loaded() -> None:
    cands = [cand("b0", load=8000, cached=5000), cand("b1", load=7000), cand("b2", load=7500)]
    assert pick(PrefixThreshold(), cands, INFO) == "b1"


def test_imbalanced_loads_go_to_the_least_loaded_whatever_is_cached() -> None:
    cands = [cand("b0", load=100_000, cached=9000), cand("b1", load=1000), cand("b2", load=2000)]
    assert pick(PrefixThreshold(), cands, INFO) == "b1"
    # imbalance needs both: the ratio and the absolute gap (here the gap is small)
    assert pick(PrefixThreshold(balance_abs_tokens=200_000), cands, INFO) == "b0"


def test_a_shared_system_prompt_alone_does_not_pin() -> None:
    # every backend holds the 1,024-token system prompt: least loaded decides
    cands = [cand("b0", load=3000, cached=1024), cand("b1", load=1000, cached=1024)]
    assert pick(PrefixThreshold(), cands, RouteInfo("t", num_prompt_tokens=6000)) == "b1"


def test_built_by_the_factory_with_string_parameters() -> None:
    policy = build_policy("prefix_threshold")
    assert isinstance(policy, PrefixThreshold) and policy.cache_threshold == 0.5
    with pytest.raises(PolicyConfigError):
        PrefixThreshold(cache_threshold=1.5)


def test_own_pool_ranks_before_host_tier_before_regional_pool() -> None:
    cands = [
        Candidate("region", in_flight_prefill_tokens=7000, region_pool_tokens=8000),
        Candidate("host", in_flight_prefill_tokens=7000, host_tier_tokens=8000),
        Candidate("pool", in_flight_prefill_tokens=7000, cached_prefix_tokens=8000),
        cand("miss", load=6500),
    ]
    for expected in ("pool", "host", "region"):
        assert pick(PrefixThreshold(), cands, INFO) == expected
        cands = [c for c in cands if c.id != expected]
    assert pick(PrefixThreshold(), cands, INFO) == "miss"


def test_a_regional_hit_counts_toward_the_threshold_at_the_share_it_saves() -> None:
    # 6,000 tokens in the region save 0.8 x 6,000 = 4,800 < half the prompt: least loaded instead
    cands = [Candidate("b0", in_flight_prefill_tokens=7000, region_pool_tokens=6000), cand("b1", load=6500)]
    assert pick(PrefixThreshold(), cands, INFO) == "b1"
    assert pick(PrefixThreshold(region_pool_cost=0.0), cands, INFO) == "b0"
    assert PrefixThreshold().score_of(cands[0], INFO) == pytest.approx(1 - 4800 / 10_000)
