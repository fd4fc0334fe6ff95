"""What a long sequence costs the decode steps of the short ones it is batched with.

    python -m benchmarks.engine.decode_groups [--repeats 12] [--long 1500]

SmolLM2-135M as a backend runs it (default weights, one torch thread, a float32 cache whose
blocks hold data), on this process's core. Each step decodes one token per row; the shapes are
interleaved, and the time is this thread's CPU time (`time.thread_time`), so other processes on a
shared machine change it little. Rows: 2 and 4 short streams (a mixed backend's share of 4
streams, a decode backend's), and 4 streams next to one `--long`-token sequence (an imported prompt
decoding its answer), attended in groups of similar context length (the engine's way) and as one
group padded to the longest context (its way before).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engines.builtin.config import EngineConfig
from engines.builtin.runner.attention import DecodeGroup
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner

SHORT = [30, 45, 60, 80]


def items(runner: ModelRunner, contexts: list[int]) -> list[ForwardItem]:
    out, first = [], 1
    for context in contexts:
        num_blocks = context // runner.block_size + 1
        out.append(ForwardItem([5], context, list(range(first, first + num_blocks))))
        first += num_blocks
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine.decode_groups", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=12)
    parser.add_argument("--long", type=int, default=1500, help="context of the long sequence")
    args = parser.parse_args(argv)
    runner = ModelRunner(EngineConfig(num_threads=1, num_kv_blocks=1024))
    for cache in runner.kv_caches:
        cache.normal_()  # touched pages, as in a serving cache
    grouped = runner.prepare_decode_groups

    def one_group(decodes: list[ForwardItem]) -> list[DecodeGroup]:  # the engine's way before: one padded group
        return [runner.prepare_decode_group(0, decodes)] if decodes else []

    cases = {
        "2 streams": (SHORT[:2], grouped),
        "4 streams": (SHORT, grouped),
        f"4 streams + one {args.long}-token row, grouped by context": ([*SHORT, args.long], grouped),
        f"4 streams + one {args.long}-token row, one padded group": ([*SHORT, args.long], one_group),
    }
    seconds: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.repeats):
        for name, (contexts, grouping) in cases.items():
            runner.prepare_decode_groups = grouping  # type: ignore[method-assign]
            batch = items(runner, contexts)
            started = time.thread_time()
            runner.execute(batch)
            seconds[name].append(time.thread_time() - started)
    print("| decode step | CPU per step (median) |\n|---|---|")
    for name, values in seconds.items():
        print(f"| {name} | {1e3 * statistics.median(values[2:]):.1f} ms |")  # the first two warm up
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    raise SystemExit(main())
