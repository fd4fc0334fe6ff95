from __future__ import annotations

import pytest

from policies.base import Candidate, Policy, RouteInfo, TierCosts, healthy_candidates, load_bound, stable_hash
from policies.errors import PolicyConfigError, PolicyError
from policies.factory import PolicyConfig, build_policy, policy_names


def test_candidate_load_weights_decode_tokens() -> None:
    c = Candidate("b0", in_flight_prefill_tokens=100, in_flight_decode_tokens=40)
    assert c.load() == 140
    assert c.load(decode_weight=0.5) == 120


@pytest.mark.parametrize("field", ["in_flight_prefill_tokens", "in_flight_decode_tokens", "cached_prefix_tokens"])
def test_candidate_rejects_negative_counts(field: str) -> None:
    with pytest.raises(PolicyError, match=field):
        Candidate("b0", **{field: -1})


def test_candidate_needs_an_id() -> None:
    with pytest.raises(PolicyError):
        Candidate("")


def test_healthy_candidates_keeps_order_and_drops_unhealthy() -> None:
    cands = [Candidate("b2"), Candidate("b1", healthy=False), Candidate("b0")]
    assert [c.id for c in healthy_candidates(cands)] == ["b2", "b0"]


def test_duplicate_candidate_ids_are_refused() -> None:
    with pytest.raises(PolicyError, match="duplicate"):
        healthy_candidates([Candidate("b0"), Candidate("b0")])


def test_routing_key_prefers_session_then_request_then_prefix() -> None:
    assert RouteInfo("t", session_id="s", request_id="r").routing_key != RouteInfo("t", request_id="r").routing_key
    assert RouteInfo("t", session_id="s").routing_key == RouteInfo("t", session_id="s", request_id="x").routing_key
    assert RouteInfo("t", session_id="s").routing_key != RouteInfo("u", session_id="s").routing_key
    assert RouteInfo("t", block_hashes=(1, 2)).routing_key != RouteInfo("t", block_hashes=(3,)).routing_key


def test_route_info_rejects_negative_token_counts() -> None:
    with pytest.raises(PolicyError):
        RouteInfo("t", num_prompt_tokens=-1)


def test_stable_hash_is_fixed_across_processes() -> None:
    # blake2b, not hash(): this value must never change, or sessions would move on upgrade
    assert stable_hash("a", "b") == stable_hash("a", "b")
    assert stable_hash("a", "b") != stable_hash("ab")
    assert stable_hash("acme", "session-1") == 0x5EF5D4720466A666
    assert 0 <= stable_hash("x") < 2**64


def test_load_bound_is_one_plus_eps_times_mean() -> None:
    assert load_bound({"a": 100, "b": 300}, 0.25) == 250


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_returns_none_when_nothing_is_healthy(name: str) -> None:
    policy = build_policy(name)
    assert policy.select([], RouteInfo("t")) is None
    assert policy.select([Candidate("b0", healthy=False), Candidate("b1", healthy=False)], RouteInfo("t")) is None


@pytest.mark.parametrize("name", policy_names())
def test_every_policy_skips_unhealthy_backends(name: str) -> None:
    policy = build_policy(name)
    cands = [Candidate(f"b{i}", healthy=(i == 2)) for i in range(4)]
    for s in range(20):
        choice = policy.select(cands, RouteInfo("t", session_id=f"s{s}", previous_backend_id="b0"))
        assert choice is not None and choice.id == "b2"


def test_hooks_do_nothing_by_default() -> None:
    policy: Policy = build_policy("round_robin")
    policy.on_complete("b0", RouteInfo("t"), success=False)
    policy.update_loads({"b0": 10})


def test_a_pool_hit_beats_a_host_tier_hit_which_beats_a_regional_hit_which_beats_a_miss() -> None:
    costs = TierCosts(host_tier=0.1, region_pool=0.2)
    pool, host, region, miss = (
        Candidate("pool", cached_prefix_tokens=8000),
        Candidate("host", host_tier_tokens=8000),
        Candidate("region", region_pool_tokens=8000),
        Candidate("miss"),
    )
    assert [c.prefill_cost(10_000, costs) for c in (pool, host, region, miss)] == [2000, 2800, 3600, 10_000]
    assert [c.effective_cached_tokens(costs) for c in (pool, host, region, miss)] == [8000, 7200, 6400, 0]
    mixed = Candidate("mixed", cached_prefix_tokens=1000, host_tier_tokens=2000, region_pool_tokens=3000)
    assert mixed.reusable_prefix_tokens == 6000 and mixed.prefill_cost(10_000, costs) == 4000 + 200 + 600


def test_without_tier_information_costs_are_the_uncached_tokens() -> None:
    c = Candidate("b0", cached_prefix_tokens=3000)
    assert c.prefill_cost(10_000, TierCosts()) == 7000 and c.effective_cached_tokens(TierCosts()) == 3000
    assert c.prefill_cost(2000, TierCosts()) == 0


@pytest.mark.parametrize("policy", ["cache_aware", "prefix_threshold"])
def test_tier_costs_are_shares_of_a_prefill(policy: str) -> None:
    with pytest.raises(PolicyConfigError, match="region_pool_cost=1.5"):
        build_policy(PolicyConfig(policy, {"region_pool_cost": "1.5"}))


@pytest.mark.parametrize("field", ["host_tier_tokens", "region_pool_tokens"])
def test_candidate_rejects_negative_tier_counts(field: str) -> None:
    with pytest.raises(PolicyError, match=field):
        Candidate("b0", **{field: -1})
