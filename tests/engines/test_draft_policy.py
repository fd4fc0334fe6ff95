"""The adaptive draft length: expected tokens, the cost model and the per-sequence acceptance."""

from __future__ import annotations

import pytest

from engines.builtin.speculative.draft_policy import DraftPolicy, StepCosts, best_num_drafts, expected_tokens


def test_expected_tokens_is_the_geometric_sum() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


@pytest.mark.parametrize(
    ("alpha", "cost", "expected"),
    [(0.05, 0.25, 0), (0.2, 0.25, 0), (0.5, 0.25, 1), (0.9, 0.2, 4), (0.99, 0.1, 8), (1.0, 0.0, 8)],
)
def test_best_num_drafts_weighs_acceptance_against_cost(alpha: float, cost: float, expected: int) -> None:
    k = best_num_drafts(alpha, cost, 8)
    if expected in (0, 8):
        assert k == expected
    else:
        assert k >= expected
    assert expected_tokens(alpha, k) / (1 + cost * k) >= 1.0  # never knowingly slower than a decode


def test_step_costs_fit_the_slope_per_verify_token() -> None:
    costs = StepCosts(prior_verify_cost=0.7)
    assert costs.verify_cost == 0.7  # nothing measured yet
    costs.observe_step(1, 0.010)
    assert costs.verify_cost == 0.7  # one row length: no slope yet
    for n, seconds in [(3, 0.015), (5, 0.020), (1, 0.010)]:
        costs.observe_step(n, seconds)
    assert costs.verify_cost == pytest.approx(0.25)  # 2.5 ms per token over a 10 ms decode
    assert costs.draft_cost == 0.0
    costs.observe_drafts(4, 0.004)
    assert costs.draft_cost == pytest.approx(0.1)


def test_a_sequence_stops_drafting_after_rejections_and_grows_after_acceptances() -> None:
    policy = DraftPolicy(max_drafts=8, costs=StepCosts(prior_verify_cost=0.25))
    assert 1 <= policy.num_drafts("a") <= 3  # the prior: a short draft
    for _ in range(3):
        policy.observe("a", policy.num_drafts("a") or 1, 0)
    assert policy.num_drafts("a") == 0
    for _ in range(6):
        k = policy.num_drafts("a") or 1  # a shadow draft while it drafts nothing
        policy.observe("a", k, k)
    assert policy.num_drafts("a") >= 6
    assert policy.num_drafts("b") == policy.num_drafts("new")  # sequences are independent
    policy.finish("a")
    assert policy.num_drafts("a") == policy.num_drafts("new")


def test_shadow_drafts_of_a_costly_proposer_are_rationed() -> None:
    costs = StepCosts(prior_verify_cost=0.25)
    policy = DraftPolicy(max_drafts=4, costs=costs, shadow_every=4)
    assert all(policy.wants_shadow("a") for _ in range(5))  # no proposer cost measured: every step
    costs.observe_step(1, 0.010)
    costs.observe_drafts(1, 0.002)  # 20% of a decode per draft
    assert [policy.wants_shadow("a") for _ in range(8)] == [False, False, False, True] * 2
