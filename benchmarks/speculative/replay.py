"""Draft-length policies replayed offline over the target's greedy answers: speed-up without timing noise.

    python -m benchmarks.speculative.replay                       # generates the answers once (cached)
    python -m benchmarks.speculative.replay --verify-cost 0.11 --max-tokens 128
    python -m benchmarks.speculative.replay --row-ms 14.1 18.1 23.0 29.6 38.0   # measured step times per row length
    python -m benchmarks.speculative.replay --speculative-model DIR --categories chat --max-tokens 64   # EAGLE-3

Greedy output is the same with or without speculation, so once the target's answers to the prompts
of data/prompts.json are known, every verify step of n-gram speculation can be
replayed exactly (an EAGLE-3 head drafts from the target's teacher-forced hidden states, as the
engine feeds it): the drafts the proposer would make at each point, how many the target accepts,
how many tokens the step emits. Charging a step 1 + verify_cost * k plain decode steps (k drafts;
benchmarks/speculative/verify_cost.py measures verify_cost) gives each policy's speed-up over plain decoding,
free of the noise that a shared machine puts into wall-clock runs. Batch 1, decode phase only.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor

from engines.builtin.speculative.draft_policy import DraftPolicy, StepCosts
from engines.builtin.speculative.ngram import lookup
from engines.builtin.speculative.proposer import DraftInput

PROMPTS = Path(__file__).resolve().parents[2] / "data" / "prompts.json"


def answers(model: str, max_tokens: int, cache: Path) -> dict[str, tuple[list[int], list[int]]]:
    """category+index -> (prompt ids, greedy answer ids); generated once into `cache`."""
    if cache.exists():
        return {k: (p, a) for k, (p, a) in json.loads(cache.read_text()).items()}
    from engines.base import GenerationRequest
    from engines.builtin.config import EngineConfig
    from engines.builtin.engine.llm_engine import LLMEngine
    from engines.sampling_params import SamplingParams

    engine = LLMEngine(EngineConfig(model=model, num_kv_blocks=2048, max_num_seqs=16))
    tok = engine.tokenizer
    prompts = {}
    for category, texts in json.loads(PROMPTS.read_text()).items():
        for i, text in enumerate(texts):
            prompts[f"{category}{i}"] = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
    for key, prompt in prompts.items():
        engine.add_request(GenerationRequest(key, prompt, SamplingParams(max_tokens=max_tokens)))
    out: dict[str, list[int]] = {key: [] for key in prompts}
    while engine.has_unfinished:
        for output in engine.step():
            out[output.request_id].extend(output.new_token_ids)
    result = {key: (prompts[key], out[key]) for key in prompts}
    cache.write_text(json.dumps(result))
    return result


class Drafter(Protocol):
    """Drafts for one answer as the engine's proposer would make them."""

    cost: float  # the proposer's time per drafted token, in plain decode steps

    def __call__(self, committed: list[int], k: int) -> list[int]: ...


@dataclass(slots=True)
class NgramDrafter:
    min_n: int
    max_n: int
    cost: float = 0.0

    def __call__(self, committed: list[int], k: int) -> list[int]:
        return lookup(committed, k, self.min_n, self.max_n)


@dataclass(slots=True)
class Eagle3Drafter:
    """An EAGLE-3 head fed the target's hidden states of the committed tokens (teacher-forced:
    `aux` [T, 3 * D] over prompt + answer), as the engine feeds it after each verify step."""

    proposer: Any  # Eagle3Proposer
    aux: Tensor
    cost: float
    seq_id: str = "replay"
    hidden_end: int = 0

    def __call__(self, committed: list[int], k: int) -> list[int]:
        # the target has run every committed token but the last
        n = len(committed) - 1
        item = DraftInput(self.seq_id, committed, k, self.aux[self.hidden_end : n], self.hidden_end)
        self.hidden_end = n
        return self.proposer.propose([item])[0]


@dataclass(slots=True)
class StepCost:
    """A batch-1 step of 1 + k tokens, in plain decode steps: 1 + verify_cost * k, or from measured step times
    (`row_ms[k]`: rows of 1, 2, ... tokens, as benchmarks.speculative.verify_cost prints them; linear past the last two)."""

    verify_cost: float
    row_ms: list[float] | None = None

    def __call__(self, k: int) -> float:
        if self.row_ms is None:
            return 1 + self.verify_cost * k
        ms = self.row_ms
        if k < len(ms):
            return ms[k] / ms[0]
        return (ms[-1] + (k - len(ms) + 1) * (ms[-1] - ms[-2])) / ms[0]


def replay(prompt: list[int], answer: list[int], policy: DraftPolicy | None, max_drafts: int, step_cost: StepCost,
           draft: Drafter) -> float:
    """Speed-up of speculation over plain decoding on one answer (its first token comes from prefill).
    A step costs step_cost(drafts verified) + draft.cost * (drafts made) decode steps; the policy learns the
    step costs as the engine's does (`StepCosts.observe_step`)."""
    full = prompt + answer
    committed, cost = len(prompt) + 1, 0.0
    while committed < len(full):
        left = len(full) - committed
        k = max_drafts if policy is None else policy.num_drafts("s")
        k = min(k, left - 1)
        if k == 0:  # a plain decode; with a policy, maybe a shadow draft checked against the answer
            if policy is not None and policy.wants_shadow("s"):
                drafts = draft(full[:committed], 1)
                cost += draft.cost * len(drafts)
                if drafts:
                    policy.observe("s", 1, int(drafts[0] == full[committed]))
            cost, committed = cost + 1, committed + 1
            if policy is not None:
                policy.costs.observe_step(1, step_cost(0))
            continue
        drafts = draft(full[:committed], k)
        accepted = leading_matches(drafts, full[committed : committed + k])
        if policy is not None and drafts:
            policy.observe("s", len(drafts), accepted)
        cost, committed = cost + step_cost(len(drafts)) + draft.cost * len(drafts), committed + accepted + 1
        if policy is not None:
            policy.costs.observe_step(1 + len(drafts), step_cost(len(drafts)))
    return (len(answer) - 1) / cost if cost else 1.0


def leading_matches(drafts: list[int], truth: list[int]) -> int:
    """How many drafts lead `truth` (what greedy verification accepts of them)."""
    run = 0
    while run < min(len(drafts), len(truth)) and drafts[run] == truth[run]:
        run += 1
    return run


def eagle3_drafters(head: Path, runner: Any, data: dict[str, tuple[list[int], list[int]]], draft_cost: float) -> dict[str, Eagle3Drafter]:
    """One drafter per answer: the head in `head` over the hidden states of `runner`'s (a ModelRunner) target."""
    from engines.builtin.speculative.eagle3 import load_proposer
    from training.eagle3.features import target_features

    proposer = load_proposer(head, runner.model_config, runner.device, runner.dtype, embed=runner.weights.embed,
                             fp16_weights=runner.config.linear_format is not None)  # as the engine loads it
    out = {}
    for key, (prompt, answer) in data.items():
        aux, _ = target_features(runner.weights, runner.model_config, prompt + answer, proposer.aux_layers)
        out[key] = Eagle3Drafter(proposer, aux, draft_cost, seq_id=key)
    return out


def policy_for(max_drafts: int, verify_cost: float, draft_cost: float) -> DraftPolicy:
    costs = StepCosts(verify_cost)
    costs.observe_step(1, 1.0)  # a decode step is the unit
    costs.observe_drafts(1, draft_cost)
    return DraftPolicy(max_drafts, costs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speculative.replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=128, help="answer length generated (and replayed)")
    parser.add_argument("--verify-cost", type=float, default=0.11,
                        help="one more verify-row token, in decode steps (0.11: benchmarks.speculative.verify_cost, int4 fast mode)")
    parser.add_argument("--row-ms", type=float, nargs="+", default=None, metavar="MS",
                        help="measured ms of a batch-1 step of 1, 2, ... tokens (benchmarks.speculative.verify_cost): steps cost these "
                             "instead of 1 + verify_cost * k")
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument("--speculative-model", type=Path, default=None, help="an EAGLE-3 head directory: replay it, not n-gram")
    parser.add_argument("--draft-cost", type=float, default=0.06, help="EAGLE-3: the head's time per drafted token, in decode steps")
    parser.add_argument("--categories", nargs="+", default=["copy", "chat"], choices=["copy", "chat"])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/edgerun-speculative-answers.json"))
    args = parser.parse_args(argv)
    data = answers(args.model, args.max_tokens, args.cache)
    data = {key: (prompt, answer[: args.max_tokens]) for key, (prompt, answer) in data.items()
            if len(answer) >= 8 and key.rstrip("0123456789") in args.categories}
    if args.speculative_model is None:
        drafters: dict[str, Drafter] = {key: NgramDrafter(args.prompt_lookup_min, args.prompt_lookup_max) for key in data}
        print(f"n-gram {args.prompt_lookup_min}..{args.prompt_lookup_max}; ", end="")
    else:
        from engines.builtin.config import EngineConfig
        from engines.builtin.runner.model_runner import ModelRunner

        runner = ModelRunner(EngineConfig(model=args.model, num_kv_blocks=16))  # the engine's default weights
        drafters = dict(eagle3_drafters(args.speculative_model, runner, data, args.draft_cost))
        print(f"EAGLE-3 head {args.speculative_model}, {args.draft_cost} decode steps per draft; ", end="")
    step_cost = StepCost(args.verify_cost, args.row_ms)
    if args.row_ms is None:
        print(f"verify cost {args.verify_cost} decode steps per drafted token")
    else:
        print("step costs (decode steps) for rows of 1, 2, ... tokens: " + ", ".join(f"{step_cost(k):.2f}" for k in range(9)))
    print("| policy | prompts | mean speed-up | lowest | highest | accepted drafts per step at k=1..4 |")
    print("|---|---|---|---|---|---|")
    for name, max_drafts, adaptive in [("fixed k=1", 1, False), ("fixed k=2", 2, False), ("fixed k=4", 4, False),
                                       ("fixed k=8", 8, False), ("adaptive k<=8", 8, True)]:
        for category in args.categories:
            speedups, accepted = [], [0.0] * 4
            keys = [key for key in data if key.startswith(category)]  # a one-word answer has nothing to speed up
            for key in keys:
                prompt, answer = data[key]
                draft = drafters[key]
                policy = policy_for(max_drafts, args.verify_cost, draft.cost) if adaptive else None
                speedups.append(replay(prompt, answer, policy, max_drafts, step_cost, draft))
                finish(draft)
            if name == "fixed k=1":
                accepted = mean_accepted(data, keys, drafters)
            mean = sum(speedups) / len(speedups)
            extra = " / ".join(f"{a:.2f}" for a in accepted) if name == "fixed k=1" else ""
            print(f"| {name} | {category} | {mean:.2f}x | {min(speedups):.2f}x | {max(speedups):.2f}x | {extra} |")


def mean_accepted(data: dict[str, tuple[list[int], list[int]]], keys: list[str], drafters: dict[str, Drafter]) -> list[float]:
    """Mean accepted drafts of a chain of k = 1..4 at every answer position (what k drafts could gain)."""
    totals, positions = [0] * 4, 0
    for key in keys:
        prompt, answer = data[key]
        full, draft = prompt + answer, drafters[key]
        for committed in range(len(prompt) + 1, len(full)):
            run = leading_matches(draft(full[:committed], 4), full[committed : committed + 4])
            for k in range(4):
                totals[k] += min(k + 1, run)
            positions += 1
        finish(draft)
    return [t / max(1, positions) for t in totals]


def finish(draft: Drafter) -> None:
    """Forget a replayed answer's proposer state, so the next replay of it starts clean."""
    if isinstance(draft, Eagle3Drafter):
        draft.proposer.finish(draft.seq_id)
        draft.hidden_end = 0


if __name__ == "__main__":
    main()
