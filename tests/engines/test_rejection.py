"""The acceptance rules of speculative decoding (engines/builtin/speculative/rejection.py).

The sampled rule must leave the target distribution untouched. A chi-square test over many draws
checks it, on the pure function and through the engine with a small random model (sampled token
pairs with and without drafts), and the same tests must reject a deliberately biased rule (on rejection, drawing from the
target p instead of the residual max(0, p - q), a classic mistake that over-weights the draft).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.runner.model_runner import ModelRunner
from engines.builtin.speculative import rejection
from engines.builtin.speculative.proposer import DraftInput
from engines.builtin.speculative.rejection import accept_greedy, accept_sampled, residual_distribution
from engines.sampling_params import SamplingParams

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


# ---- through the engine: a small random model, sampled with and without speculation ----------

PROMPT = [1, 2, 3, 4, 5]
NUM_REQUESTS = 500  # one KV block each; the tiny runner has 512


class FixedDrafts:
    """Drafts the same tokens after every context: a deterministic drafter, right only sometimes."""

    aux_layers: tuple[int, ...] = ()

    def __init__(self, drafts: list[int]) -> None:
        self.drafts = drafts

    def propose(self, inputs: list[DraftInput]) -> list[list[int]]:
        return [self.drafts[: i.num_drafts] for i in inputs]

    def finish(self, seq_id: str) -> None:
        pass


def sampled_pairs(runner: ModelRunner, proposer: FixedDrafts | None) -> Counter:
    config = EngineConfig(model="random:tiny", num_kv_blocks=NUM_REQUESTS, max_num_seqs=NUM_REQUESTS,
                          max_num_batched_tokens=NUM_REQUESTS * len(PROMPT), weight_dtype="float32",
                          max_waiting=NUM_REQUESTS, speculative_max_concurrency=NUM_REQUESTS)
    engine = LLMEngine(config, runner, proposer=proposer)
    for i in range(NUM_REQUESTS):
        params = SamplingParams(max_tokens=3, temperature=1.0, top_k=2, seed=i, ignore_eos=True)
        engine.add_request(GenerationRequest(f"s{i}", PROMPT, params))
    tokens: dict[str, list[int]] = {}
    num_verified = 0
    while engine.has_unfinished:
        for output in engine.step():
            tokens.setdefault(output.request_id, []).extend(output.new_token_ids)
            num_verified += output.num_verify_steps if output.is_finished else 0
    assert proposer is None or num_verified == NUM_REQUESTS  # every request verified drafts once
    return Counter(tuple(t[:2]) for t in tokens.values())  # the first sampled and the first verified token


def homogeneity_p_value(a: Counter, b: Counter) -> float:
    # chi-square test that two samples of categories come from one distribution
    cells = sorted(set(a) | set(b))
    table = torch.tensor([[a[c] for c in cells], [b[c] for c in cells]], dtype=torch.float64)  # [2, C]
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    statistic = ((table - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((len(cells) - 1) / 2, dtype=torch.float64), statistic / 2))


def test_engine_sampling_with_drafts_matches_sampling_without(tiny_runner: ModelRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = sampled_pairs(tiny_runner, None)
    likeliest = max(plain, key=plain.__getitem__)  # drafts accepted often, not always
    drafter = FixedDrafts([likeliest[1], likeliest[1]])
    assert homogeneity_p_value(plain, sampled_pairs(tiny_runner, drafter)) > 1e-3
    monkeypatch.setattr(rejection, "residual_distribution", lambda p, q: p)
    assert homogeneity_p_value(plain, sampled_pairs(tiny_runner, drafter)) < 1e-6
