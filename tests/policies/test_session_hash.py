from __future__ import annotations

from collections import Counter

import pytest

from policies.base import Candidate, Policy, RouteInfo, stable_hash
from policies.errors import PolicyConfigError
from policies.session_hash import HashRing, SessionHash


def pick(policy: Policy, candidates: list[Candidate], info: RouteInfo) -> str:
    choice = policy.select(candidates, info)
    assert choice is not None
    return choice.id


def pool(n: int, **loads: int) -> list[Candidate]:
    return [Candidate(f"b{i}", in_flight_prefill_tokens=loads.get(f"b{i}", 0)) for i in range(n)]


def test_a_session_keeps_its_backend() -> None:
    policy = SessionHash()
    first = pick(policy, pool(8), RouteInfo("acme", session_id="s1"))
    assert all(pick(policy, pool(8), RouteInfo("acme", session_id="s1")) == first for _ in range(10))


def test_sessions_spread_evenly_over_the_ring() -> None:
    policy = SessionHash()
    counts = Counter(pick(policy, pool(8), RouteInfo("acme", session_id=f"s{i}")) for i in range(4000))
    assert len(counts) == 8
    assert max(counts.values()) / min(counts.values()) < 1.5  # 160 virtual nodes each


def test_tenant_is_part_of_the_key() -> None:
    policy = SessionHash()
    moved = sum(
        pick(policy, pool(8), RouteInfo("a", session_id=f"s{i}"))
        != pick(policy, pool(8), RouteInfo("b", session_id=f"s{i}"))
        for i in range(100)
    )
    assert moved > 50


def test_removing_a_backend_moves_only_its_sessions() -> None:
    policy = SessionHash()
    before = {i: pick(policy, pool(8), RouteInfo("t", session_id=f"s{i}")) for i in range(500)}
    smaller = [c for c in pool(8) if c.id != "b3"]
    after = {i: pick(policy, smaller, RouteInfo("t", session_id=f"s{i}")) for i in range(500)}
    moved = [i for i in before if before[i] != after[i]]
    assert moved and all(before[i] == "b3" for i in moved)


def test_overloaded_ring_choice_falls_to_next_backend_under_the_bound() -> None:
    policy = SessionHash(eps=0.25)
    info = RouteInfo("acme", session_id="s42")
    home = pick(policy, pool(4), info)
    ring = HashRing([f"b{i}" for i in range(4)], policy.virtual_nodes)
    walk = list(ring.walk(stable_hash("key", info.routing_key)))
    assert walk[0] == home and len(walk) == 4
    # home far above (1 + eps) x mean, the next one on the ring a bit above too: go to the third
    loads = {walk[0]: 10_000, walk[1]: 5_000, walk[2]: 100, walk[3]: 0}
    assert pick(policy, pool(4, **loads), info) == walk[2]
    # home loaded but within the bound: stays home
    mild = {walk[0]: 1200, walk[1]: 1000, walk[2]: 1000, walk[3]: 1000}
    assert pick(policy, pool(4, **mild), info) == home


def test_ring_walk_visits_each_backend_once() -> None:
    ring = HashRing(["a", "b", "c"], 50)
    for point in (0, 2**63, 2**64 - 1):
        assert sorted(ring.walk(point)) == ["a", "b", "c"]


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(PolicyConfigError):
        SessionHash(virtual_nodes=0)
    with pytest.raises(PolicyConfigError):
        SessionHash(eps=-0.1)
