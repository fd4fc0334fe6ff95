"""A cold 1,000-token prefill: the built-in engine (fast and deterministic modes) against transformers.

    python -m benchmarks.engine.prefill [--tokens 1000] [--rounds 5] [--threads 2] [--profile]

One process, the same GGUF weights (SmolLM2-135M-Instruct). Each round runs a new prompt (so nothing
is cached) through transformers' `generate` for one token (float32, eager: the baseline of
BENCHMARKS.md's "Engine against transformers"), then through each of our modes (LLMEngine, one request, time to its
first token: the prefill in chunks of `max_num_batched_tokens`, then sampling). Reports per side
the median wall time and the median CPU time of this process (steadier than wall time on a shared
machine), and our/transformers ratios of the medians. `--profile` prints torch.profiler's top
operators of one prefill per mode, to see where the time goes.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import machine
from benchmarks.engine.baselines import HFBaseline
from benchmarks.engine.compare import Ours, long_prompt
from engines.builtin.config import EngineConfig
from engines.builtin.loader import smollm2_gguf_path

Prefill = Callable[[list[int], str], float]  # prompt, salt -> seconds to the first token


def ours_prefill(ours: Ours) -> Prefill:
    def run(prompt: list[int], salt: str) -> float:
        started, times, cached = ours.generate_one(prompt, 1, salt=salt)
        assert cached == 0, "a cold prefill must not hit the prefix cache"
        return times[0] - started

    return run


def hf_prefill(hf: HFBaseline) -> Prefill:
    def run(prompt: list[int], salt: str) -> float:
        started, times = hf.generate_one(prompt, 1)
        return times[0] - started

    return run


def timed(fn: Prefill, prompt: list[int], salt: str) -> tuple[float, float]:
    """(wall s to the first token, this process's CPU s over the call)."""
    cpu = time.process_time()
    wall = fn(prompt, salt)
    return wall, time.process_time() - cpu


def top_ops(fn: Prefill, prompt: list[int], salt: str, rows: int = 12) -> str:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(prompt, salt)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine.prefill", description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1000, help="prompt tokens")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (both sides)")
    parser.add_argument("--modes", nargs="+", default=["fast", "deterministic"], choices=["fast", "deterministic"])
    parser.add_argument("--profile", action="store_true", help="print the top operators of one prefill per side")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    engines = {mode: Ours(EngineConfig(mode=mode, num_kv_blocks=(args.tokens // 16 + 2) * 4)) for mode in args.modes}
    encode = next(iter(engines.values())).runner.tokenizer.encode
    sides: dict[str, Prefill] = {"transformers": hf_prefill(HFBaseline(smollm2_gguf_path()))}
    sides |= {f"edgerun {mode}": ours_prefill(ours) for mode, ours in engines.items()}
    for name, fn in sides.items():  # warm-up: first calls, allocator
        fn(long_prompt(encode, args.tokens, "warm-up"), f"warm-up {name}")
    if args.profile:
        for name, fn in sides.items():
            print(f"## {name}: top operators of one prefill\n\n{top_ops(fn, long_prompt(encode, args.tokens, 'p'), 'p')}\n")

    load_start = os.getloadavg()[0]
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        prompt = long_prompt(encode, args.tokens, f"round {r}")
        for name, fn in sides.items():  # interleaved: every side sees the same machine each round
            results[name].append(timed(fn, prompt, f"round {r}"))

    print(f"Command: `python -m benchmarks.engine.prefill {shlex.join(sys.argv[1:] if argv is None else argv)}`")
    print(f"Machine: {machine(with_torch=True)}, {args.threads} torch threads, load average {load_start:.1f} "
          f"at start, {os.getloadavg()[0]:.1f} at end")
    print(f"Cold {args.tokens}-token prefill to the first token, median of {args.rounds} interleaved rounds\n")
    print("| side | wall s | CPU s | wall / transformers | CPU / transformers | wall per round (s) |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    base_wall = statistics.median(w for w, _ in results["transformers"])
    base_cpu = statistics.median(c for _, c in results["transformers"])
    for name, runs in results.items():
        wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
        per_round = " ".join(f"{w:.2f}" for w, _ in runs)
        print(f"| {name} | {wall:.2f} | {cpu:.2f} | {wall / base_wall:.2f}x | {cpu / base_cpu:.2f}x | {per_round} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
