"""A step of many streams split over one-thread workers vs run whole with every torch thread, in-process.

    python -m benchmarks.engine.step_split [--streams 16] [--prompt-tokens 128] [--max-tokens 64] [--rounds 3]
                                    [--threads 2] [--set FIELD=VALUE]

One `LLMEngine` (fast mode unless `--set` says otherwise) runs rounds of `--streams` random-token
prompts generating exactly `--max-tokens` tokens each (greedy, ignore_eos, a fresh cache salt per
round, so every prefill is cold), the engine loop called directly. Rounds alternate between the
runner's step workers (engines/builtin/runner/step_split.py) and none (every step one forward pass with
`--threads` torch threads). Reported per side: median aggregate tok/s (all tokens over the round's
wall time), median process CPU s per round, and each round's tok/s; plus the load average.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import statistics
import sys
import time
from typing import TYPE_CHECKING

from engines.omp import may_bound_omp_spinning

if TYPE_CHECKING:
    from engines.builtin.engine.llm_engine import LLMEngine


def one_round(engine: LLMEngine, prompts: list[list[int]], max_tokens: int, salt: str) -> tuple[float, float]:
    """-> (wall s, process CPU s) to run every prompt to max_tokens."""
    from benchmarks.engine.compare import greedy

    for i, prompt in enumerate(prompts):
        engine.add_request(greedy(f"{salt}-{i}", prompt, max_tokens, salt))
    wall, cpu = time.perf_counter(), time.process_time()
    while engine.has_unfinished:
        engine.step()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine.step_split", description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the whole-step side")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="an EngineConfig field")
    args = parser.parse_args(argv)
    may_bound_omp_spinning()  # before torch loads, as the backend does
    from benchmarks.engine.compare import engine_options
    from engines.builtin.config import EngineConfig
    from engines.builtin.engine.llm_engine import LLMEngine

    config = EngineConfig(num_threads=args.threads, max_num_seqs=max(args.streams, 1),
                          **engine_options(args.set))  # type: ignore[arg-type]
    engine = LLMEngine(config)
    workers = engine.runner.step_workers
    if workers is None:
        print("this runner has no step workers (one torch thread, or step_workers=1): nothing to compare", file=sys.stderr)
        return 2
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 30000) for _ in range(args.prompt_tokens)] for _ in range(args.streams)]
    one_round(engine, prompts[:2], 8, "warm-up")
    load_start = os.getloadavg()[0]
    sides = {"whole": None, "split": workers}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for r in range(args.rounds):
        for name, side_workers in sides.items():
            engine.runner.step_workers = side_workers
            results[name].append(one_round(engine, prompts, args.max_tokens, f"{name}-{r}"))
    engine.runner.step_workers = workers
    tokens = args.streams * args.max_tokens
    print(f"Command: `python -m benchmarks.engine.step_split {shlex.join(argv)}`")
    print(f"weights {config.linear_format or config.dtype}, {args.threads} torch threads whole, {workers.num_workers} "
          f"one-thread workers split; load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end\n")
    print("| side | aggregate tok/s | process CPU s | tok/s per round |")
    print("| --- | ---: | ---: | --- |")
    for name, rounds in results.items():
        rates = [tokens / wall for wall, _ in rounds]
        print(f"| {name} | {statistics.median(rates):.1f} | {statistics.median(cpu for _, cpu in rounds):.2f} | "
              f"{' '.join(f'{x:.1f}' for x in rates)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
