"""Per-row LoRA in a batch: tokens/s of 16 streams under 0, 1, 4 and 16 distinct adapters, and adapter load time.

    python -m benchmarks.engine.lora_batch [--streams 16] [--adapters 0,1,4,16] [--rank 8]
        [--targets q_proj,v_proj] [--prompt-tokens 32] [--max-tokens 64] [--rounds 3] [--threads 2]
        [--set FIELD=VALUE]

One `LLMEngine` (SmolLM2, fast mode, unless `--set` says otherwise) with random rank-`--rank` PEFT adapters
written to a temporary directory (its `lora_dir`). Each round runs `--streams` random-token prompts to exactly
`--max-tokens` tokens (greedy, ignore_eos, a fresh cache salt), the streams spread round-robin over N distinct
adapters (N = 0: the base model); the N are interleaved within each round, so load drifts hit them alike.
Reported per N: median aggregate tok/s (all generated tokens over the round's wall time), the median time of a
step that is all decodes (every stream's one token), and that step against N = 0's, in wall time and in the
process's CPU time (all its threads: steadier than wall time on a machine others load). Then the time to load
one adapter from disk into a slot (`ResidentAdapters.load`: read, check, copy), median of 8.
"""

from __future__ import annotations

import argparse
import os
import random
import shlex
import statistics
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engines.omp import may_bound_omp_spinning

if TYPE_CHECKING:
    from engines.builtin.engine.llm_engine import LLMEngine


def one_round(
    engine: LLMEngine, prompts: list[list[int]], max_tokens: int, salt: str, adapters: list[str]
) -> tuple[float, list[float], list[float]]:
    """-> (wall s of the round, the wall and the CPU times of its all-decode steps)."""
    from benchmarks.engine.compare import greedy

    for i, prompt in enumerate(prompts):
        request = greedy(f"{salt}-{i}", prompt, max_tokens, salt)
        request.lora = adapters[i % len(adapters)] if adapters else None
        engine.add_request(request)
    decode_steps: list[float] = []
    decode_cpu: list[float] = []
    wall = time.perf_counter()
    while engine.has_unfinished:
        is_decode = not engine.scheduler.waiting and all(not s.is_prefilling for s in engine.scheduler.running)
        started, cpu = time.perf_counter(), time.process_time()
        engine.step()
        if is_decode and len(engine.scheduler.running) == len(prompts):
            decode_steps.append(time.perf_counter() - started)
            decode_cpu.append(time.process_time() - cpu)
    return time.perf_counter() - wall, decode_steps, decode_cpu


def load_times_ms(engine: LLMEngine, directory: Path, names: list[str]) -> list[float]:
    """Each adapter in `names` loaded into a free slot (evicting the least recently used), in ms."""
    times = []
    for name in names:
        slot = engine.adapters.acquire(name)
        times.append(engine.adapters.last_load_ms)
        engine.adapters.release(slot)
    return times


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine.lora_batch", description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--adapters", default="0,1,4,16", help="numbers of distinct adapters in the batch")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--targets", default="q_proj,v_proj", help="PEFT target modules (all: every projection)")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="an EngineConfig field")
    args = parser.parse_args(argv)
    may_bound_omp_spinning()
    from benchmarks.common import cpu_model
    from benchmarks.engine.compare import engine_options
    from contracts.lora_adapter import MODULES
    from engines.builtin.config import EngineConfig
    from engines.builtin.engine.llm_engine import LLMEngine
    from tests.engines.lora_files import write_adapter

    counts = [int(n) for n in args.adapters.split(",")]
    targets = tuple(MODULES) if args.targets == "all" else tuple(args.targets.split(","))
    directory = Path(tempfile.mkdtemp(prefix="edgerun-lora-bench-"))
    options = engine_options(args.set)
    config = EngineConfig(num_threads=args.threads, max_num_seqs=max(args.streams, 1), lora_dir=directory,
                          max_loras=max(max(counts), 1), **options)  # type: ignore[arg-type]
    engine = LLMEngine(config)
    model = engine.runner.model_config
    names = [f"a{i}" for i in range(max(counts))]
    for i, name in enumerate(names + [f"load{i}" for i in range(8)]):
        write_adapter(directory / name, model, args.rank, targets, seed=i, std=0.01)
    rng = random.Random(0)
    vocab = min(model.vocab_size, 30000)
    prompts = [[rng.randrange(100, vocab) for _ in range(args.prompt_tokens)] for _ in range(args.streams)]
    one_round(engine, prompts, 4, "warm-up", names)  # loads every adapter once
    load_start = os.getloadavg()[0]
    walls: dict[int, list[float]] = {n: [] for n in counts}
    steps: dict[int, list[float]] = {n: [] for n in counts}
    cpus: dict[int, list[float]] = {n: [] for n in counts}
    for r in range(args.rounds):
        for n in counts:
            wall, decode_steps, decode_cpu = one_round(engine, prompts, args.max_tokens, f"n{n}-r{r}", names[:n])
            walls[n].append(wall)
            steps[n] += decode_steps
            cpus[n] += decode_cpu
    load_ms = load_times_ms(engine, directory, [f"load{i}" for i in range(8)])
    tokens = args.streams * args.max_tokens
    base_step = statistics.median(steps[counts[0]]) if steps[counts[0]] else float("nan")
    base_cpu = statistics.median(cpus[counts[0]]) if cpus[counts[0]] else float("nan")
    print(f"Command: `python -m benchmarks.engine.lora_batch {shlex.join(argv)}`")
    print(f"{cpu_model()}; weights {config.linear_format or config.dtype}, {args.threads} torch threads; rank {args.rank} "
          f"on {','.join(targets)}; load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end\n")
    print(f"| distinct adapters in the batch | aggregate tok/s | decode step ms (median) | step vs {counts[0]} "
          f"| step CPU ms (median) | CPU vs {counts[0]} |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in counts:
        step = statistics.median(steps[n]) if steps[n] else float("nan")
        cpu = statistics.median(cpus[n]) if cpus[n] else float("nan")
        print(f"| {n} | {tokens / statistics.median(walls[n]):.0f} | {1e3 * step:.1f} | {step / base_step:.2f}x "
              f"| {1e3 * cpu:.1f} | {cpu / base_cpu:.2f}x |")
    print(f"\nadapter load from disk (rank {args.rank}, {','.join(targets)}): median {statistics.median(load_ms):.1f} ms "
          f"(min {min(load_ms):.1f}, max {max(load_ms):.1f})")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
