"""Decode and prefill speed of the built-in engine on a CUDA device, with random Llama weights.

    python -m benchmarks.engine.cuda [--model random:llama-1b] [--dtype bfloat16] [--streams 1 16 64]
        [--tokens 128] [--prompt-tokens 1000] [--repeats 3] [--device cuda] [--out results.json]

No checkpoint is needed: `random:<preset>` draws a seeded model of that shape on the device
(engines/builtin/loader/random.py). Decode: `streams` greedy requests with 32-token prompts start
together; after the step that prefills them all, every step decodes one token per stream, and
tokens/s counts those steps only (the mean step time is the inter-token latency). Prefill: the time
to the first token of one `prompt-tokens` prompt, run as one chunk (fresh ids each repeat: no prefix
hits). Each figure is the median of `repeats`, after one warm-up of each kind.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.common import machine
from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.runner.model_runner import ModelRunner
from engines.sampling_params import SamplingParams

PROMPT_TOKENS = 32  # per decode stream
BLOCK_SIZE = 16  # KV cache tokens per block (the engine's default)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def random_prompt(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    return [rng.randrange(10, vocab_size) for _ in range(length)]


def decode_run(runner: ModelRunner, config: EngineConfig, num_streams: int, num_tokens: int, rng: random.Random
               ) -> tuple[float, float]:
    """-> (decode tokens/s over all streams, mean decode step in ms)."""
    engine = LLMEngine(config, runner)
    vocab = runner.model_config.vocab_size
    for i in range(num_streams):
        sampling = SamplingParams(max_tokens=num_tokens, ignore_eos=True)
        engine.add_request(GenerationRequest(f"s{i}", random_prompt(rng, PROMPT_TOKENS, vocab), sampling))
    started: set[str] = set()
    while len(started) < num_streams:  # the prefill steps (one, when max_num_batched_tokens holds every prompt)
        started.update(output.request_id for output in engine.step())
    synchronize(runner.device)
    start, num_generated, num_steps = time.perf_counter(), 0, 0
    while engine.has_unfinished:
        num_generated += sum(len(output.new_token_ids) for output in engine.step())
        num_steps += 1
    synchronize(runner.device)
    elapsed = time.perf_counter() - start
    return num_generated / elapsed, elapsed / max(1, num_steps) * 1000


def prefill_run(runner: ModelRunner, config: EngineConfig, num_prompt_tokens: int, rng: random.Random) -> float:
    """-> seconds to the first token of a fresh `num_prompt_tokens` prompt."""
    engine = LLMEngine(config, runner)
    prompt = random_prompt(rng, num_prompt_tokens, runner.model_config.vocab_size)
    synchronize(runner.device)
    start = time.perf_counter()
    engine.add_request(GenerationRequest("p", prompt, SamplingParams(max_tokens=1, ignore_eos=True)))
    while engine.has_unfinished:
        engine.step()
    synchronize(runner.device)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine.cuda", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random:llama-1b")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--tokens", type=int, default=128, help="tokens generated per decode stream")
    parser.add_argument("--prompt-tokens", type=int, default=1000, help="the prefill prompt's length")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args(argv)

    max_streams = max(args.streams)
    budget = max(args.prompt_tokens, max_streams * PROMPT_TOKENS)
    blocks_per_stream = -(-(PROMPT_TOKENS + args.tokens) // BLOCK_SIZE)
    num_kv_blocks = max(max_streams * blocks_per_stream, -(-budget // BLOCK_SIZE)) + 16  # 16 blocks spare
    config = EngineConfig(
        model=args.model, device=args.device, dtype=args.dtype, mode="fast", max_num_seqs=max_streams,
        max_num_batched_tokens=budget, block_size=BLOCK_SIZE, num_kv_blocks=num_kv_blocks,
    )
    started = time.perf_counter()
    runner = ModelRunner(config)
    synchronize(runner.device)
    load_s = time.perf_counter() - started
    rng = random.Random(0)
    decode_run(runner, config, min(args.streams), 8, rng)  # warm-up: CUDA context, kernels, library handles
    prefill_run(runner, config, args.prompt_tokens, rng)

    results: dict[str, object] = {"model": args.model, "dtype": args.dtype, "device": args.device,
                                  "machine": machine(with_torch=True), "load_s": round(load_s, 2)}
    rows = []
    for num_streams in args.streams:
        runs = [decode_run(runner, config, num_streams, args.tokens, rng) for _ in range(args.repeats)]
        rate = statistics.median(r[0] for r in runs)
        step_ms = statistics.median(r[1] for r in runs)
        results[f"decode_{num_streams}"] = {"tokens_per_s": round(rate, 1), "step_ms": round(step_ms, 2)}
        rows.append(f"| decode, {num_streams} stream{'s' if num_streams > 1 else ''} | {rate:,.0f} tok/s | {step_ms:.2f} ms/step |")
    ttft = statistics.median(prefill_run(runner, config, args.prompt_tokens, rng) for _ in range(args.repeats))
    results["prefill"] = {"prompt_tokens": args.prompt_tokens, "ttft_ms": round(ttft * 1000, 1),
                          "tokens_per_s": round(args.prompt_tokens / ttft)}
    rows.append(f"| prefill, {args.prompt_tokens} tokens | {args.prompt_tokens / ttft:,.0f} tok/s | TTFT {ttft * 1000:.1f} ms |")
    if runner.device.type == "cuda":
        results["max_memory_gib"] = round(torch.cuda.max_memory_allocated(runner.device) / 2**30, 2)

    command = "python -m benchmarks.engine.cuda " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"`{command.strip()}`  ")
    print(f"{args.model}, {args.dtype}, {args.device}; {results['machine']}; weights drawn in {load_s:.1f}s  ")
    print(f"{args.tokens} tokens per decode stream after {PROMPT_TOKENS}-token prompts; median of {args.repeats}\n")
    print("| what | throughput | latency |\n| --- | ---: | ---: |")
    print("\n".join(rows))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
