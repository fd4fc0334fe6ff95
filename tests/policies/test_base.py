from __future__ import annotations

import pytest

from policies.base import Candidate, Policy, RouteInfo, healthy_candidates, load_bound, stable_hash
from policies.errors import PolicyError
from policies.factory import build_policy, policy_names


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
