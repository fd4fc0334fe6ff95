"""What a speculative verify row costs next to a plain decode step, at batch 1.

    python -m benchmarks.speculative.verify_cost                       # k = 0 (decode), 1, 2, 4, 8 at context 150
    python -m benchmarks.speculative.verify_cost --paths engine torch --drafts 0 1 2 3 4 5 6 7 8   # fused vs model.py's path
    python -m benchmarks.speculative.verify_cost --profile 8           # torch.profiler table of decode and of 1 + 8

One runner (SmolLM2, the engine's default weights) holds one sequence whose first `context` tokens
are in the KV cache; each measurement runs `ModelRunner.execute` on the next 1 + k tokens there
(logits at all of them, as a verify row asks) and rolls back, so every step sees the same cache.
Rows of all k run interleaved in each round; the table gives the median CPU time of a step (this
process, so busy neighbours disturb it less than wall time; `--clock wall` for wall time, which is what a
stream sees with several threads) and its ratio to the decode step.
`--paths engine torch` also runs every row on model.py's torch path (the runner's fused step off),
interleaved with the engine's own choice (the fused step where it applies), and compares the two.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from benchmarks.common import machine
from engines.builtin.config import EngineConfig
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--context", type=int, default=150, help="tokens already in the cache")
    parser.add_argument("--drafts", type=int, nargs="+", default=[0, 1, 2, 4, 8], help="k: drafts per verify row (0: decode)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", type=int, default=None, metavar="K", help="print a profile of decode and of 1 + K")
    parser.add_argument("--clock", default="cpu", choices=["cpu", "wall"], help="this process's CPU time or wall time")
    parser.add_argument("--paths", nargs="+", default=["engine"], choices=["engine", "torch"],
                        help="engine: the runner as built (fused where it applies); torch: model.py's path only")
    return parser.parse_args(argv)


def item(context: int, num_drafts: int, block_table: list[int]) -> ForwardItem:
    tokens = [(17 * i + 5) % 1000 + 100 for i in range(num_drafts + 1)]
    return ForwardItem(tokens, context, block_table, num_logits=num_drafts + 1)


def step_seconds(runner: ModelRunner, step: ForwardItem, path: str = "engine", clock: str = "cpu") -> float:
    now = time.process_time if clock == "cpu" else time.perf_counter
    fused = runner.fused
    if path == "torch":
        runner.fused = None
    try:
        start = now()
        runner.execute([step])
        return now() - start
    finally:
        runner.fused = fused


def profile(runner: ModelRunner, step: ForwardItem) -> str:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for _ in range(3):
        runner.execute([step])
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(10):
            runner.execute([step])
    return str(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    runner = ModelRunner(EngineConfig(model=args.model, num_threads=args.threads, num_kv_blocks=64))
    longest = args.context + max(args.drafts + [args.profile or 0]) + 1
    block_table = list(range(-(-longest // runner.block_size)))
    prompt = [(31 * i + 7) % 5000 + 100 for i in range(args.context)]
    runner.execute([ForwardItem(prompt, 0, block_table)])  # the context's KV, written once
    if args.profile is not None:
        for k in (0, args.profile):
            print(f"--- 1 + {k} tokens at position {args.context}")
            print(profile(runner, item(args.context, k, block_table)))
        return 0
    times: dict[tuple[str, int], list[float]] = {(path, k): [] for path in args.paths for k in args.drafts}
    for path, k in times:  # warm-up
        step_seconds(runner, item(args.context, k, block_table), path, args.clock)
    for _ in range(args.rounds):
        for path, k in times:
            times[path, k].append(step_seconds(runner, item(args.context, k, block_table), path, args.clock))
    load = os.getloadavg()[0]
    print(f"# {machine(with_torch=True)}; load average {load:.1f}; context {args.context}, {args.threads} thread(s), "
          f"{args.rounds} rounds, median {args.clock} ms/step; fused step {'on' if runner.fused else 'off'} in the runner")
    base = statistics.median(times[args.paths[0], args.drafts[0]])
    print(f"| tokens in the row | {' | '.join(f'{p} ms/step | vs first row | {p} p90 ms' for p in args.paths)} |"
          + (" engine / torch |" if len(args.paths) == 2 else ""))
    print("|---|" + "---|---|---|" * len(args.paths) + ("---|" if len(args.paths) == 2 else ""))
    for k in args.drafts:
        cells = []
        for path in args.paths:
            med = statistics.median(times[path, k])
            p90 = sorted(times[path, k])[int(0.9 * (len(times[path, k]) - 1))]
            cells.append(f"{1000 * med:.1f} | {med / base:.2f}x | {1000 * p90:.1f}")
        ratio = ""
        if len(args.paths) == 2:
            ratio = f" {statistics.median(times['engine', k]) / statistics.median(times['torch', k]):.2f} |"
        print(f"| 1 + {k} | {' | '.join(cells)} |{ratio}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
