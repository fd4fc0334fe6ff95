"""The adaptive draft length: expected tokens, the cost model and the per-sequence acceptance."""

from __future__ import annotations

import pytest

from engines.builtin.speculative.draft_policy import (
    Acceptance,
    DraftPolicy,
    StepCosts,
    best_num_drafts,
    expected_tokens,
)


def linear(cost: float):
    return lambda k: 1.0 + cost * k


def costs_from(row_ms: list[float], samples: int = 3) -> StepCosts:
    """Step costs that have seen `samples` steps of each row length 1, 2, ... at `row_ms`."""
    costs = StepCosts(prior_verify_cost=0.25)
    for _ in range(samples):
        for n, ms in enumerate(row_ms, start=1):
            costs.observe_step(n, ms / 1000)
    return costs


def test_expected_tokens_is_the_geometric_sum() -> None:
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


@pytest.mark.parametrize(
    ("alpha", "cost", "expected"),
    [(0.05, 0.25, 0), (0.2, 0.25, 0), (0.5, 0.25, 1), (0.9, 0.2, 4), (0.99, 0.1, 8), (1.0, 0.0, 8)],
)
def test_best_num_drafts_weighs_acceptance_against_cost(alpha: float, cost: float, expected: int) -> None:
    k = best_num_drafts(alpha, linear(cost), 8)
    if expected in (0, 8):
        assert k == expected
    else:
        assert k >= expected
    assert expected_tokens(alpha, k) / (1 + cost * k) >= 1.0  # never knowingly slower than a decode


def test_best_num_drafts_prices_each_row_length_as_measured() -> None:
    # rows of 2 tokens cheap, 3 and more dear (two threads, wall clock, 2026-11-26): at alpha 0.75 one
    # draft pays 1.75 / 1.4 = 1.25 and two 2.31 / 2.1 = 1.10; a per-token line through the same
    # table (0.77 per token) would price one draft at 1.77 and draft nothing
    table = [1.0, 1.4, 2.1, 3.1, 3.6, 4.3, 5.6, 5.9, 7.2]
    assert best_num_drafts(0.75, lambda k: table[k], 8) == 1
    assert best_num_drafts(0.75, linear((7.2 - 1.0) / 8), 8) == 0
    # rows of 3 and more tokens add more cost than tokens even at 0.95; 0.4 per token would draft long
    assert best_num_drafts(0.95, lambda k: table[k], 8) == 1
    assert best_num_drafts(0.95, linear(0.4), 8) >= 3


def test_step_costs_price_measured_lengths_from_their_own_medians() -> None:
    costs = StepCosts(prior_verify_cost=0.7)
    assert costs.row_cost(1) == pytest.approx(1.7)  # nothing measured yet: the prior per token
    costs.observe_step(1, 0.010)
    assert costs.row_cost(2) == pytest.approx(2.4)  # one row length: still the prior
    costs = costs_from([10.0, 14.0, 25.0])
    assert [costs.row_cost(k) for k in range(3)] == pytest.approx([1.0, 1.4, 2.5])  # not a straight line
    costs.observe_step(2, 0.200)  # one step that a neighbour preempted
    assert costs.row_cost(1) == pytest.approx(1.4)  # the median of 4 steps: (14 + 14) / 2
    costs.observe_step(1, 0.200)
    assert costs.decode_seconds == pytest.approx(0.010)


def test_step_costs_extrapolate_unmeasured_lengths_never_below_a_shorter_measured_one() -> None:
    costs = costs_from([10.0, 14.0, 25.0])
    # the line through the medians: 7.5 ms per token over a 10 ms decode
    assert costs.verify_cost == pytest.approx(0.75)
    assert costs.row_cost(4) == pytest.approx(1 + 0.75 * 4)
    costs = costs_from([10.0, 11.0, 40.0])  # one cheap, one very dear length
    costs.observe_step(4, 0.012)  # a single time of 4 tokens: too few to price that length alone
    assert costs.row_cost(3) >= 4.0  # never cheaper than the 3-token rows measured
    costs = costs_from([10.0, 14.0])
    costs.observe_step(3, 0.012)  # one lucky 3-token step
    assert costs.row_cost(2) >= costs.row_cost(1)


def test_step_cost_adds_the_proposer() -> None:
    costs = costs_from([10.0, 14.0])
    assert costs.draft_cost == 0.0
    costs.observe_drafts(4, 0.004)
    assert costs.draft_cost == pytest.approx(0.1)
    assert costs.step_cost(1) == pytest.approx(1.5)


def test_the_acceptance_bound_is_below_the_estimate_and_tightens_with_evidence() -> None:
    few, many = Acceptance(3.0, 4.0), Acceptance(30.0, 40.0)
    assert few.alpha == many.alpha == 0.75
    assert few.lower_bound(1.0) < many.lower_bound(1.0) < 0.75
    assert few.lower_bound(0.0) == 0.75
    assert Acceptance(0.0, 3.0).lower_bound(1.0) == 0.0


def observe_rate(policy: DraftPolicy, seq: str, rate: float, steps: int) -> None:
    """`steps` single-draft trials of which a fraction `rate` are right, evenly spread."""
    right = 0.0
    for _ in range(steps):
        hit = int(right + rate >= 1.0)
        right = right + rate - hit
        policy.observe(seq, 1, hit)


@pytest.mark.parametrize("table", [[10.0, 14.0, 21.0, 31.0, 36.0], [10.0, 12.8, 16.3, 21.0, 27.0]], ids=["two-threads", "one-thread"])
def test_drafting_stops_when_it_would_not_pay_and_resumes_when_acceptance_rises(table: list[float]) -> None:
    policy = DraftPolicy(max_drafts=4, costs=costs_from(table), margin=1.0)
    costs = policy.costs
    break_even = costs.step_cost(1) - 1.0  # one draft pays when its acceptance beats this
    observe_rate(policy, "a", max(0.0, break_even - 0.1), 40)
    assert policy.num_drafts("a") == 0  # expected tokens per unit time below plain decoding: no drafts
    observe_rate(policy, "a", min(1.0, break_even + 0.05), 40)
    assert policy.num_drafts("a") == 0  # barely above break-even from a handful of drafts: not yet sure
    observe_rate(policy, "a", 0.95, 40)
    k = policy.num_drafts("a")
    assert k >= 1  # acceptance rose: drafting again
    assert expected_tokens(0.95, k) / costs.step_cost(k) > 1.0
    observe_rate(policy, "a", 0.1, 20)
    assert policy.num_drafts("a") == 0  # and stops again


@pytest.mark.parametrize("alpha", [i / 20 for i in range(21)])
def test_a_settled_acceptance_is_drafted_on_only_where_it_pays(alpha: float) -> None:
    table = [10.0, 14.0, 21.0, 31.0, 36.0, 43.0, 56.0, 59.0, 72.0]
    policy = DraftPolicy(max_drafts=8, costs=costs_from(table))
    observe_rate(policy, "a", alpha, 60)
    k = policy.num_drafts("a")
    gain = expected_tokens(alpha, k) / policy.costs.step_cost(k)
    assert gain >= 1.0  # never a draft length that the measured acceptance says is slower than decoding
    if max(expected_tokens(alpha, j) / policy.costs.step_cost(j) for j in range(9)) > 1.25:
        assert k >= 1  # and a clear gain is taken


def test_a_new_sequence_waits_for_evidence_where_drafts_are_dear() -> None:
    policy = DraftPolicy(max_drafts=8, costs=costs_from([10.0, 14.0, 21.0]))
    assert policy.num_drafts("new") == 0  # the prior (0.5 from 2 drafts) does not clear a 1.4x row
    for _ in range(4):
        policy.observe("new", 1, 1)  # shadow drafts that were right
    assert policy.num_drafts("new") >= 1


def test_a_sequence_stops_drafting_after_rejections_and_grows_after_acceptances() -> None:
    policy = DraftPolicy(max_drafts=8, costs=StepCosts(prior_verify_cost=0.25))
    assert policy.num_drafts("a") <= 3  # the prior: a short draft at most
    for _ in range(3):
        policy.observe("a", policy.num_drafts("a") or 1, 0)
    assert policy.num_drafts("a") == 0
    for _ in range(10):
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


def test_verify_row_times_that_stopped_drafting_are_measured_again_later() -> None:
    # Verify rows timed during a neighbour's burst price every draft length above what it yields even at
    # acceptance 1, so the engine decodes only. Only verify steps time verify rows: their medians would
    # stand for the engine's life and no sequence would ever draft again, however cheap rows became.
    costs = costs_from([10.0, 25.0, 37.0, 50.0, 62.0], samples=16)
    policy = DraftPolicy(max_drafts=4, costs=costs)
    observe_rate(policy, "a", 1.0, 20)  # a copy task: every shadow draft right
    assert policy.num_drafts("a") == 0  # the burst's rows: drafting does not pay
    for _ in range(1000):
        costs.observe_step(1, 0.010)  # decoding on, the burst over
    k = policy.num_drafts("a")
    assert k >= 1  # the old rows are forgotten: drafting tries again, and the rows are timed anew
    costs.observe_step(k + 1, 0.030 * (k + 1))  # still dear (3 decodes a token): that one time stops it again
    assert policy.num_drafts("a") == 0
