"""Sampler maths on plain tensors: penalties, filters, seeds, greedy fast path."""

from __future__ import annotations

import math

import torch

from engines.builtin.engine.sequence import Sequence
from engines.builtin.runner.sampler import (
    Sampler,
    apply_frequency_presence,
    apply_repetition_penalty,
    apply_top_k,
    apply_top_p,
    greedy_ids,
)
from engines.sampling_params import SamplingParams

V = 50


def make_seq(prompt: list[int], generated: list[int] = (), **sampling: object) -> Sequence:
    seq = Sequence("r", list(prompt), SamplingParams(**sampling))
    seq.token_ids += list(generated)
    return seq


def random_logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    logits = torch.tensor([[2.0, -2.0, 3.0, -1.0]])
    seen = torch.tensor([[True, True, False, False]])
    out = apply_repetition_penalty(logits, seen, torch.tensor([[2.0]]))
    assert out.tolist() == [[1.0, -4.0, 3.0, -1.0]]


def test_frequency_and_presence_follow_openai() -> None:
    logits = torch.zeros(1, 4)
    counts = torch.tensor([[0.0, 1.0, 3.0, 0.0]])
    out = apply_frequency_presence(logits, counts, torch.tensor([[0.5]]), torch.tensor([[1.0]]))
    assert out.tolist() == [[0.0, -1.5, -2.5, 0.0]]


def test_penalties_through_the_sampler_use_prompt_and_output() -> None:
    # repetition covers prompt + output; frequency/presence only the generated tokens
    seq = make_seq([1, 2], [3, 3], repetition_penalty=2.0, frequency_penalty=1.0, presence_penalty=0.5)
    logits = torch.full((1, V), 4.0)
    out = Sampler().prepare_penalised(logits, [seq])
    assert out[0, 1] == 2.0 and out[0, 2] == 2.0  # prompt tokens: repetition only
    assert out[0, 3] == 4.0 / 2 - 2 * 1.0 - 0.5  # generated twice
    assert out[0, 4] == 4.0
    assert logits[0, 1] == 4.0  # the caller's tensor is untouched


def test_top_k_keeps_k_best_per_row() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    out = apply_top_k(logits, torch.tensor([2, 1]))
    assert torch.isfinite(out).tolist() == [[False, True, False, True], [True, False, False, False]]


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    out = apply_top_p(probs.log(), torch.tensor([[0.8]]))
    assert torch.isfinite(out).tolist() == [[True, True, False, False]]
    out = apply_top_p(probs.log(), torch.tensor([[0.81]]))
    assert torch.isfinite(out).tolist() == [[True, True, True, False]]
    out = apply_top_p(probs.log(), torch.tensor([[0.01]]))
    assert torch.isfinite(out).tolist() == [[True, False, False, False]]  # the best token always stays


def test_greedy_fast_path_is_argmax() -> None:
    logits = random_logits(3)
    seqs = [make_seq([1]) for _ in range(3)]
    assert Sampler()(logits, seqs) == logits.argmax(-1).tolist()


def test_greedy_ids_is_torch_argmax_with_ties_and_nan() -> None:
    logits = random_logits(4)
    logits[1, 7] = logits[1, 30] = 1e9  # a tie: the first index
    logits[2, 11] = float("nan")  # NaN wins, as in torch
    logits[3, 5] = logits[3, 9] = float("nan")
    expected = [int(i) for i in logits.argmax(dim=-1)]
    assert expected[1:] == [7, 11, 5]
    assert greedy_ids(logits) == expected
    assert greedy_ids(logits[1:3]) == expected[1:3]  # a view of some rows
    assert greedy_ids(logits.to(torch.bfloat16)) == logits.to(torch.bfloat16).argmax(dim=-1).tolist()


def test_top_k_1_equals_greedy() -> None:
    logits = random_logits(4, seed=1)
    seqs = [make_seq([1], temperature=1.5, top_k=1) for _ in range(4)]
    assert Sampler()(logits, seqs) == logits.argmax(-1).tolist()


def test_seed_reproducible_regardless_of_batch() -> None:
    logits = random_logits(1, seed=2)
    alone = make_seq([1], temperature=1.0, seed=42)
    draws_alone = [Sampler()(logits, [alone])[0] for _ in range(20)]
    crowd = [make_seq([1], temperature=1.0) for _ in range(3)]
    batched = make_seq([1], temperature=1.0, seed=42)
    sampler = Sampler()
    big = torch.cat([random_logits(1, seed=9), logits, random_logits(2, seed=3)])
    draws_batched = [sampler(big, [crowd[0], batched, *crowd[1:]])[1] for _ in range(20)]
    assert draws_alone == draws_batched
    assert len(set(draws_alone)) > 1  # it does sample
    other = make_seq([1], temperature=1.0, seed=43)
    assert [Sampler()(logits, [other])[0] for _ in range(20)] != draws_alone


def test_sampling_matches_the_distribution() -> None:
    probs = torch.tensor([0.6, 0.3, 0.1] + [0.0] * (V - 3))
    logits = probs.clamp_min(1e-30).log().unsqueeze(0)
    seq = make_seq([1], temperature=1.0, seed=7)
    sampler = Sampler()
    draws = [sampler(logits, [seq])[0] for _ in range(3000)]
    freq = [draws.count(i) / len(draws) for i in range(3)]
    assert all(math.isclose(f, p, abs_tol=0.04) for f, p in zip(freq, [0.6, 0.3, 0.1]))
    assert set(draws) <= {0, 1, 2}


def test_mixed_batch_greedy_rows_stay_greedy() -> None:
    logits = random_logits(2, seed=5)
    seqs = [make_seq([1]), make_seq([1], temperature=2.0, seed=1)]
    assert Sampler()(logits, seqs)[0] == int(logits[0].argmax())
