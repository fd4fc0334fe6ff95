"""Speculative decoding on vs off in the same built-in engine, interleaved, at several stream counts.

    python -m benchmarks.speculative.engine                          # n-gram lookup vs none, SmolLM2, 1/4/16 streams
    python -m benchmarks.speculative.engine --speculative eagle3 --speculative-model DIR
    python -m benchmarks.speculative.engine --streams 1 --rotate-prompts --rounds 8 --torch-verify   # fused verify's worth

One model runner is loaded once; every measurement builds a fresh engine over it (a cold prefix
cache each time, so both sides pay the same prefill) and generates greedily from `streams` chat
prompts of one category at once: (a) "copy", tool calls, JSON and code edits that repeat their
context; (b) "chat", open questions (data/prompts.json). Each round runs off,
then on, so both see the same machine; the report gives the median tokens/s of each side, their
ratio, and the acceptance of the speculating side (drafts accepted / verified, tokens per verify
step). Both sides generate the same tokens up to float rounding (greedy is exact in exact weight
mode; the default float16 weights may flip a near-tie).

`--rotate-prompts`: round r starts at prompt r * streams, so that at one stream the rounds go through the
category's prompts in turn (without it every round runs the first `streams` prompts); the totals then
compare sums of tokens over sums of seconds. `--torch-verify`: a third side, speculating with verify rows
kept on model.py's torch path (as before they ran through the fused step), run after the other two each round.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import machine
from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.runner.fused_decode import FusedDecode
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner
from engines.builtin.speculative.factory import build_proposer
from engines.builtin.speculative.proposer import Proposer
from engines.sampling_params import SamplingParams

PROMPTS = Path(__file__).resolve().parents[2] / "data" / "prompts.json"


@dataclass(slots=True)
class Run:
    seconds: float
    num_tokens: int
    decode_seconds: float  # from the step where every request had its first token
    cpu_seconds: float  # this process's CPU time (all threads): less sensitive to busy neighbours
    num_decode_tokens: int  # tokens after that step
    num_drafts: int
    num_accepted: int
    num_verify_steps: int
    num_steps: int

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.num_tokens / self.cpu_seconds

    @property
    def decode_tokens_per_s(self) -> float:
        return self.num_decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


def generate(runner: ModelRunner, config: EngineConfig, proposer: Proposer | None, prompts: list[list[int]], max_tokens: int) -> Run:
    engine = LLMEngine(config, runner, proposer=proposer)
    for i, prompt in enumerate(prompts):
        engine.add_request(GenerationRequest(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens)))
    num_tokens = num_drafts = num_accepted = num_verify = num_steps = 0
    started: set[str] = set()
    decode_start, tokens_at_decode_start = None, 0
    start, cpu_start = time.perf_counter(), time.process_time()
    while engine.has_unfinished:
        num_steps += 1
        for output in engine.step():
            num_tokens += len(output.new_token_ids)
            started.add(output.request_id)
            if output.is_finished:
                num_drafts += output.num_draft_tokens
                num_accepted += output.num_accepted_draft_tokens
                num_verify += output.num_verify_steps
        if decode_start is None and len(started) == len(prompts):
            decode_start, tokens_at_decode_start = time.perf_counter(), num_tokens
    end = time.perf_counter()
    decode_start = end if decode_start is None else decode_start
    return Run(end - start, num_tokens, end - decode_start, time.process_time() - cpu_start,
               num_tokens - tokens_at_decode_start, num_drafts, num_accepted, num_verify, num_steps)


def torch_verify(runner: ModelRunner) -> ModelRunner:
    """A view of `runner` that runs steps holding a verify row on the torch path (the fused step for decodes only)."""
    view = copy.copy(runner)

    def fused_for(items: list[ForwardItem]) -> FusedDecode | None:
        return None if any(item.is_verify for item in items) else runner.fused_for(items)

    view.fused_for = fused_for  # type: ignore[method-assign]
    return view


def total_rate(runs: list[Run]) -> float:
    return sum(r.num_tokens for r in runs) / sum(r.seconds for r in runs)


def summarise(off: list[Run], on: list[Run], torch_on: list[Run]) -> dict:
    off_rate = statistics.median(r.tokens_per_s for r in off)
    on_rate = statistics.median(r.tokens_per_s for r in on)
    off_decode = statistics.median(r.decode_tokens_per_s for r in off)
    on_decode = statistics.median(r.decode_tokens_per_s for r in on)
    drafts, accepted, verify = (sum(getattr(r, f) for r in on) for f in ("num_drafts", "num_accepted", "num_verify_steps"))
    extra = {}
    if torch_on:
        t_drafts, t_accepted = (sum(getattr(r, f) for r in torch_on) for f in ("num_drafts", "num_accepted"))
        extra = {
            "torch_verify_tok_s": round(statistics.median(r.tokens_per_s for r in torch_on), 1),
            "torch_verify_total_ratio": round(total_rate(torch_on) / total_rate(off), 2),
            "torch_verify_rounds": [round(r.tokens_per_s, 1) for r in torch_on],
            "torch_verify_drafts": t_drafts,
            "torch_verify_acceptance_rate": round(t_accepted / t_drafts, 3) if t_drafts else None,
        }
    return {
        "off_tok_s": round(off_rate, 1),
        "on_tok_s": round(on_rate, 1),
        "ratio": round(on_rate / off_rate, 2),
        "off_decode_tok_s": round(off_decode, 1),
        "on_decode_tok_s": round(on_decode, 1),
        "decode_ratio": round(on_decode / off_decode, 2) if off_decode else None,
        "cpu_ratio": round(statistics.median(r.tokens_per_cpu_s for r in on)
                           / statistics.median(r.tokens_per_cpu_s for r in off), 2),
        "off_rounds": [round(r.tokens_per_s, 1) for r in off],
        "on_rounds": [round(r.tokens_per_s, 1) for r in on],
        "acceptance_rate": round(accepted / drafts, 3) if drafts else None,
        "tokens_per_verify_step": round(1 + accepted / verify, 2) if verify else None,
        "tokens_per_step_on": round(sum(r.num_tokens for r in on) / sum(r.num_steps for r in on), 2),
        "tokens": [off[0].num_tokens, on[0].num_tokens],
        "total_ratio": round(total_rate(on) / total_rate(off), 2),
        "drafts": drafts,
        "verify_steps": verify,
        **extra,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.speculative.engine", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--speculative", default="ngram", choices=["ngram", "eagle3"])
    parser.add_argument("--speculative-model", help="EAGLE-3 head directory (--speculative eagle3)")
    parser.add_argument("--num-speculative-tokens", type=int, default=EngineConfig().num_speculative_tokens,
                        help="most drafts per verify step (the engine's default unless given)")
    parser.add_argument("--fixed", action="store_true", help="always draft --num-speculative-tokens (no adaptive draft length)")
    parser.add_argument("--prompt-lookup-min", type=int, default=2)
    parser.add_argument("--prompt-lookup-max", type=int, default=4)
    parser.add_argument("--weight-dtype", default="auto", help="auto (float16 linear weights on CPU) or float32 (exact)")
    parser.add_argument("--speculative-max-concurrency", type=int, default=EngineConfig().speculative_max_concurrency,
                        help="no speculation above this many running requests (the engine's default unless given)")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--categories", nargs="+", default=["copy", "chat"])
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--rotate-prompts", action="store_true", help="round r starts at prompt r * streams")
    parser.add_argument("--torch-verify", action="store_true",
                        help="a third side: speculation with verify rows on the torch path (the fused step for decodes)")
    args = parser.parse_args(argv)

    base = dict(model=args.model, num_kv_blocks=4096, max_num_seqs=max(args.streams), weight_dtype=args.weight_dtype,
                num_threads=args.num_threads)
    off_config = EngineConfig(**base)
    on_config = EngineConfig(**base, speculative=args.speculative, num_speculative_tokens=args.num_speculative_tokens,
                             prompt_lookup_min=args.prompt_lookup_min, prompt_lookup_max=args.prompt_lookup_max,
                             speculative_model=args.speculative_model, speculative_max_concurrency=args.speculative_max_concurrency,
                             speculative_adaptive=not args.fixed)
    runner = ModelRunner(off_config)
    proposer = build_proposer(on_config, runner)
    tok = runner.tokenizer
    texts = json.loads(PROMPTS.read_text())
    results: dict = {"machine": machine(with_torch=True), "command": " ".join(sys.argv), "rows": [],
                     "load_average_start": round(os.getloadavg()[0], 1)}
    generate(runner, off_config, None, [tok.encode("Hello")], 8)  # warm-up
    for category in args.categories:
        prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}])) for t in texts[category]]
        for streams in args.streams:
            off, on, torch_on = [], [], []
            for r in range(args.rounds):
                first = r * streams if args.rotate_prompts else 0
                batch = [prompts[(first + i) % len(prompts)] for i in range(streams)]
                off.append(generate(runner, off_config, None, batch, args.max_tokens))
                on.append(generate(runner, on_config, proposer, batch, args.max_tokens))
                if args.torch_verify:
                    torch_on.append(generate(torch_verify(runner), on_config, proposer, batch, args.max_tokens))
            row = {"category": category, "streams": streams, **summarise(off, on, torch_on)}
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
    results["load_average_end"] = round(os.getloadavg()[0], 1)
    print(report(results, args))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


def report(results: dict, args: argparse.Namespace) -> str:
    lines = [
        f"machine: {results['machine']}",
        f"command: {results['command']}",
        f"load average (1 min): {results['load_average_start']} at the start, {results['load_average_end']} at the end",
        "",
        "tok/s: generated tokens / wall time, prefill included; decode: after every request's first token.",
        "",
        "ratio: of the medians over rounds; total ratio: tokens over seconds summed over rounds.",
        "",
        f"| prompts | streams | off tok/s | {args.speculative} tok/s | ratio | total ratio | off decode | "
        f"{args.speculative} decode | decode ratio | tokens/CPU-s ratio | acceptance | tokens/verify step | drafts |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        lines.append(f"| {r['category']} | {r['streams']} | {r['off_tok_s']} | {r['on_tok_s']} | {r['ratio']}x | "
                     f"{r['total_ratio']}x | {r['off_decode_tok_s']} | {r['on_decode_tok_s']} | {r['decode_ratio']}x | "
                     f"{r['cpu_ratio']}x | {r['acceptance_rate']} | {r['tokens_per_verify_step']} | {r['drafts']} |")
    if any("torch_verify_tok_s" in r for r in results["rows"]):
        lines += ["", "verify rows on the torch path (--torch-verify), same rounds:", "",
                  "| prompts | streams | tok/s | total ratio vs off | acceptance | drafts |", "|---|---|---|---|---|---|"]
        for r in results["rows"]:
            lines.append(f"| {r['category']} | {r['streams']} | {r['torch_verify_tok_s']} | "
                         f"{r['torch_verify_total_ratio']}x | {r['torch_verify_acceptance_rate']} | {r['torch_verify_drafts']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
