"""The acceptance rules of speculative decoding (engines/builtin/speculative/rejection.py).

The sampled rule must leave the target distribution untouched. A chi-square test over many draws
checks it, and the same test must reject a deliberately biased rule (on rejection, drawing from the
target p instead of the residual max(0, p - q), a classic mistake that over-weights the draft).
"""

from __future__ import annotations

import pytest
import torch

from engines.builtin.speculative import rejection
from engines.builtin.speculative.rejection import accept_greedy, accept_sampled, residual_distribution

V = 6


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    # goodness of fit of observed counts [V] to probabilities [V]; cells with p == 0 must be empty
    n = counts.sum()
    expected = probs * n
    support = probs > 0
    assert counts[~support].sum() == 0, "a token the target gives probability 0 came out"
    statistic = ((counts[support] - expected[support]) ** 2 / expected[support]).sum()
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), statistic.double() / 2))


def first_token_counts(p: torch.Tensor, q: torch.Tensor | None, draws: int, seed: int) -> torch.Tensor:
    # p: [3, V] target rows; q: [2, V] draft distributions (drafts drawn from q) or None (fixed drafts)
    generator = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    for _ in range(draws):
        if q is None:
            drafts = [0, 1]  # a deterministic drafter
        else:
            drafts = [int(torch.multinomial(q[j], 1, generator=generator)) for j in range(2)]
        tokens = accept_sampled(p, drafts, q, generator)
        assert 1 <= len(tokens) <= 3 and tokens[:-1] == drafts[: len(tokens) - 1]
        counts[tokens[0]] += 1
    return counts


def distributions(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    p = torch.rand(3, V, generator=generator) + 0.1
    p[:, -1] = 0.0  # a token the target never produces (top-k/top-p cut it)
    p = p / p.sum(-1, keepdim=True)
    q = torch.rand(2, V, generator=generator)
    return p, q / q.sum(-1, keepdim=True)


@pytest.mark.parametrize("drafter", ["one-hot", "distribution"])
def test_sampled_acceptance_preserves_the_target_distribution(drafter: str) -> None:
    p, q = distributions(1)
    counts = first_token_counts(p, None if drafter == "one-hot" else q, 4000, seed=2)
    assert chi_square_p_value(counts, p[0]) > 1e-3


@pytest.mark.parametrize("drafter", ["one-hot", "distribution"])
def test_the_same_test_catches_a_biased_sampler(drafter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rejection, "residual_distribution", lambda p, q: p)  # the bug: ignore q on rejection
    p, q = distributions(1)
    counts = first_token_counts(p, None if drafter == "one-hot" else q, 4000, seed=2)
    assert chi_square_p_value(counts, p[0]) < 1e-6


def test_residual_removes_the_draft_mass() -> None:
    p = torch.tensor([0.5, 0.3, 0.2])
    assert torch.allclose(residual_distribution(p, torch.tensor([1.0, 0.0, 0.0])), torch.tensor([0.0, 0.6, 0.4]))
    assert torch.equal(residual_distribution(p, p.clone()), p)  # nothing left: never used, but well defined


def test_greedy_takes_the_matching_prefix_then_the_target() -> None:
    assert accept_greedy([5, 6, 7, 8], [5, 6, 7]) == [5, 6, 7, 8]  # all accepted + bonus
    assert accept_greedy([5, 9, 7, 8], [5, 6, 7]) == [5, 9]  # correction at the first mismatch
    assert accept_greedy([4, 6, 7, 8], [5, 6, 7]) == [4]
    assert accept_greedy([3], []) == [3]


def test_certain_drafts_are_always_accepted() -> None:
    p = torch.zeros(3, V)
    p[0, 2] = p[1, 4] = p[2, 1] = 1.0
    assert accept_sampled(p, [2, 4], None, torch.Generator().manual_seed(0)) == [2, 4, 1]
    assert accept_sampled(p, [3, 4], None, torch.Generator().manual_seed(0)) == [2]
