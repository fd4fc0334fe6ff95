from __future__ import annotations

from collections import Counter

import pytest

from policies.base import Candidate, Policy, RouteInfo
from policies.errors import PolicyConfigError
from policies.least_tokens import LeastTokens


def pick(policy: Policy, candidates: list[Candidate], info: RouteInfo) -> str:
    choice = policy.select(candidates, info)
    assert choice is not None
    return choice.id


def test_picks_fewest_in_flight_tokens_not_fewest_requests() -> None:
    cands = [
        Candidate("b0", in_flight_prefill_tokens=30_000),  # one huge prompt
        Candidate("b1", in_flight_prefill_tokens=900, in_flight_decode_tokens=300),  # many small ones
    ]
    assert pick(LeastTokens(), cands, RouteInfo("t")) == "b1"


def test_decode_tokens_are_weighted() -> None:
    cands = [
        Candidate("b0", in_flight_prefill_tokens=1000),
        Candidate("b1", in_flight_decode_tokens=1500),
    ]
    assert pick(LeastTokens(decode_weight=1.0), cands, RouteInfo("t")) == "b0"
    assert pick(LeastTokens(decode_weight=0.5), cands, RouteInfo("t")) == "b1"


def test_equal_loads_spread_over_backends_by_request_key() -> None:
    policy = LeastTokens()
    cands = [Candidate(f"b{i}") for i in range(4)]
    counts = Counter(pick(policy, cands, RouteInfo("t", request_id=f"r{i}")) for i in range(400))
    assert set(counts) == {"b0", "b1", "b2", "b3"}
    assert max(counts.values()) < 150  # a fair share is 100


def test_negative_decode_weight_is_refused() -> None:
    with pytest.raises(PolicyConfigError):
        LeastTokens(decode_weight=-1)
