from __future__ import annotations

from policies.base import Candidate, Policy, RouteInfo
from policies.round_robin import RoundRobin


def pick(policy: Policy, candidates: list[Candidate], info: RouteInfo) -> str:
    choice = policy.select(candidates, info)
    assert choice is not None
    return choice.id


def test_cycles_through_healthy_backends_in_id_order() -> None:
    policy = RoundRobin()
    cands = [Candidate("b2"), Candidate("b0"), Candidate("b1")]
    picks = [pick(policy, cands, RouteInfo("t")) for _ in range(6)]
    assert picks == ["b0", "b1", "b2", "b0", "b1", "b2"]


def test_ignores_load_and_cache() -> None:
    policy = RoundRobin()
    cands = [Candidate("b0", in_flight_prefill_tokens=10**6), Candidate("b1", cached_prefix_tokens=5000)]
    info = RouteInfo("t", num_prompt_tokens=5000)
    assert [pick(policy, cands, info) for _ in range(2)] == ["b0", "b1"]


def test_unhealthy_backends_are_left_out_of_the_cycle() -> None:
    policy = RoundRobin()
    cands = [Candidate("b0"), Candidate("b1", healthy=False), Candidate("b2")]
    assert [pick(policy, cands, RouteInfo("t")) for _ in range(4)] == ["b0", "b2", "b0", "b2"]
