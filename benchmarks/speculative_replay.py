"""Draft-length policies replayed offline over the target's greedy answers: speed-up without timing noise.

    python -m benchmarks.speculative_replay                       # generates the answers once (cached)
    python -m benchmarks.speculative_replay --verify-cost 0.22 --max-tokens 128

Greedy output is the same with or without speculation, so once the target's answers to the prompts
of benchmarks/speculative_prompts.json are known, every verify step of n-gram speculation can be
replayed exactly: the drafts the proposer would make at each point, how many the target accepts,
how many tokens the step emits. Charging a step 1 + verify_cost * k plain decode steps (k drafts;
benchmarks/verify_cost.py measures verify_cost) gives each policy's speed-up over plain decoding,
free of the noise that a shared machine puts into wall-clock runs. Batch 1, decode phase only.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from engines.builtin.speculative.draft_policy import DraftPolicy, StepCosts
from engines.builtin.speculative.ngram import lookup

PROMPTS = Path(__file__).with_name("speculative_prompts.json")
Chooser = Callable[[int], int]  # tokens left -> drafts for the next step


def answers(model: str, max_tokens: int, cache: Path) -> dict[str, tuple[list[int], list[int]]]:
    """category+index -> (prompt ids, greedy answer ids); generated once into `cache`."""
    if cache.exists():
        return {k: (p, a) for k, (p, a) in json.loads(cache.read_text()).items()}
    from engines.base import GenerationRequest
    from engines.builtin.config import EngineConfig
    from engines.builtin.llm_engine import LLMEngine
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


def replay(prompt: list[int], answer: list[int], policy: DraftPolicy | None, max_drafts: int, verify_cost: float,
           min_n: int, max_n: int) -> float:
    """Speed-up of n-gram speculation over plain decoding on one answer (its first token comes from prefill)."""
    full = prompt + answer
    committed, cost = len(prompt) + 1, 0.0
    while committed < len(full):
        left = len(full) - committed
        k = max_drafts if policy is None else policy.num_drafts("s")
        k = min(k, left - 1)
        drafts = lookup(full[:committed], max(k, 1), min_n, max_n)
        if k == 0:  # a plain decode; with a policy, its draft is a shadow checked against the answer
            if policy is not None and drafts:
                policy.observe("s", 1, int(drafts[0] == full[committed]))
            cost, committed = cost + 1, committed + 1
            continue
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == full[committed + accepted]:
            accepted += 1
        if policy is not None and drafts:
            policy.observe("s", len(drafts), accepted)
        cost, committed = cost + 1 + verify_cost * len(drafts), committed + accepted + 1
    return (len(answer) - 1) / cost if cost else 1.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speculative_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=128, help="answer length generated (and replayed)")
    parser.add_argument("--verify-cost", type=float, default=0.22, help="one more verify-row token, in decode steps")
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/edgerun-speculative-answers.json"))
    args = parser.parse_args(argv)
    data = answers(args.model, args.max_tokens, args.cache)
    print(f"verify cost {args.verify_cost} decode steps per drafted token; n-gram {args.prompt_lookup_min}..{args.prompt_lookup_max}")
    print("| policy | prompts | mean speed-up | lowest | highest |")
    print("|---|---|---|---|---|")
    for name, max_drafts, adaptive in [("fixed k=2", 2, False), ("fixed k=4", 4, False), ("fixed k=8", 8, False),
                                       ("adaptive k<=8", 8, True)]:
        for category in ("copy", "chat"):
            speedups = []
            for key, (prompt, answer) in data.items():
                if key.startswith(category) and len(answer) >= 8:  # a one-word answer has nothing to speed up
                    policy = DraftPolicy(max_drafts, StepCosts(args.verify_cost)) if adaptive else None
                    speedups.append(replay(prompt, answer[: args.max_tokens], policy, max_drafts, args.verify_cost,
                                           args.prompt_lookup_min, args.prompt_lookup_max))
            mean = sum(speedups) / len(speedups)
            print(f"| {name} | {category} | {mean:.2f}x | {min(speedups):.2f}x | {max(speedups):.2f}x |")


if __name__ == "__main__":
    main()
