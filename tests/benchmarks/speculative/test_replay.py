"""The offline replay of speculation: its cost accounting, and EAGLE-3 drafts fed as the engine feeds them."""

from dataclasses import dataclass

import pytest
import torch

from benchmarks.speculative.replay import NgramDrafter, StepCost, eagle3_drafters, mean_accepted, policy_for, replay
from engines.builtin.config import EngineConfig
from engines.builtin.runner.model_runner import ModelRunner
from engines.builtin.speculative.eagle3 import load_proposer
from engines.builtin.speculative.proposer import DraftInput
from tests.engines.eagle3.conftest import random_head_for
from training.eagle3.dataset import Conversation
from training.eagle3.evaluate import acceptance
from training.eagle3.export import save_head
from training.eagle3.features import target_features


@dataclass
class Oracle:
    """Drafts the answer itself: every draft is accepted."""

    full: list[int]
    cost: float = 0.0

    def __call__(self, committed: list[int], k: int) -> list[int]:
        return self.full[len(committed) : len(committed) + k]


def test_every_step_is_charged_one_decode_plus_its_verified_and_drafted_tokens():
    prompt, answer = [1, 2, 3], list(range(10, 31))  # 21 answer tokens: the first from prefill, 20 to decode
    full = prompt + answer
    # k = 4 always accepted: 4 steps of 5 tokens, each 1 + 0.2 * 4 decode steps
    assert replay(prompt, answer, None, 4, StepCost(0.2), Oracle(full)) == pytest.approx(20 / (4 * 1.8))
    assert replay(prompt, answer, None, 4, StepCost(0.2), Oracle(full, cost=0.05)) == pytest.approx(20 / (4 * 2.0))
    # a proposer that never has anything: plain decodes, 1.0x
    assert replay(prompt, answer, None, 4, StepCost(0.2), NgramDrafter(2, 4)) == pytest.approx(1.0)
    # the adaptive policy drafts long for an oracle, and beats every fixed k here
    adaptive = replay(prompt, answer, policy_for(8, 0.2, 0.0), 8, StepCost(0.2), Oracle(full))
    assert adaptive > replay(prompt, answer, None, 2, StepCost(0.2), Oracle(full))


def test_measured_step_times_price_each_row_length():
    cost = StepCost(0.2, row_ms=[10.0, 15.0, 25.0])  # rows of 1, 2, 3 tokens; linear past the last two
    assert [cost(k) for k in range(5)] == pytest.approx([1.0, 1.5, 2.5, 3.5, 4.5])
    prompt, answer = [1, 2, 3], list(range(10, 31))
    # k = 2 always accepted: 20 tokens in 6 steps of 3 tokens (2.5 each), then one of 2 (1.5)
    assert replay(prompt, answer, None, 2, cost, Oracle(prompt + answer)) == pytest.approx(20 / (6 * 2.5 + 1.5))
    # drafting pays less than at 0.2 per draft, so the adaptive policy drafts shorter rows and gains less
    assert replay(prompt, answer, policy_for(8, 0.2, 0.0), 8, cost, Oracle(prompt + answer)) < replay(
        prompt, answer, policy_for(8, 0.2, 0.0), 8, StepCost(0.2), Oracle(prompt + answer))


def test_eagle3_replay_drafts_what_the_acceptance_eval_measures(tmp_path):
    config = EngineConfig(model="random:tiny", num_kv_blocks=64, weight_dtype="float32")
    runner = ModelRunner(config)
    t = runner.model_config
    head = random_head_for(runner)
    save_head(head, tmp_path)
    # an answer that is the head's own first draft at every position: k = 1 drafts are all accepted
    # if the replay feeds the head the hidden states it drafted from (a random answer would accept none)
    prompt, answer = list(range(3, 20)), []
    proposer = load_proposer(tmp_path, t, embed=runner.weights.embed, fp16_weights=False)
    for i in range(12):
        aux, _ = target_features(runner.weights, t, prompt + answer, (0, 1, 1))
        answer += proposer.propose([DraftInput(f"grow{i}", prompt + answer, 1, aux[:-1], 0)])[0]
        proposer.finish(f"grow{i}")
    data = {"chat0": (prompt, answer)}
    drafters = eagle3_drafters(tmp_path, runner, data, draft_cost=0.05)
    replayed = mean_accepted(data, ["chat0"], drafters)
    aux, last = target_features(runner.weights, t, prompt + answer, (0, 1, 1))
    conv = Conversation(torch.tensor(prompt + answer), len(prompt), aux, last)
    evaluated = acceptance(proposer, [conv])
    assert evaluated.num_positions == len(answer) - 1
    assert replayed == pytest.approx(evaluated.mean_accepted) and replayed[0] == pytest.approx(1.0)
    assert replay(prompt, answer, policy_for(8, 0.2, 0.05), 8, StepCost(0.2), drafters["chat0"]) > 0
