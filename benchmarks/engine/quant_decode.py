"""Decode speed per weight format, in-process (the model runner alone), interleaved rounds.

    python -m benchmarks.engine.quant_decode --weight-dtype float16 auto --batch 1 16 --rounds 3 --threads 1

A format followed by "-unfused" (e.g. `auto-unfused`) is that format with the fused decode step off
(engines/builtin/runner/fused_decode.py): model.py's torch ops for every step, to measure what fusing gains.

One runner per `--weight-dtype` in this process; each round runs `benchmarks.engine.runner.measure_decode`
(random-token context, greedy steps) on every runner in turn, so all see the same machine. Reports
median wall tok/s and median process-CPU ms per step (with one thread the steadier figure on a
shared machine: what the step costs one core), and each format's ratio to the first.
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch

from benchmarks.common import machine
from benchmarks.engine.runner import measure_decode
from engines.builtin.config import EngineConfig
from engines.builtin.runner.model_runner import ModelRunner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--weight-dtype", nargs="+", default=["float16", "auto"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runners = {}
    for label in args.weight_dtype:
        w = label.removesuffix("-unfused")
        runners[label] = ModelRunner(EngineConfig(model=args.model, weight_dtype=w, num_kv_blocks=1024,
                                                  mode="deterministic" if w == "float32" else "fast"))
        if label.endswith("-unfused"):
            runners[label].fused = None
    print(f"# {machine(with_torch=True)}, threads={torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}")
    print("| batch | format | wall tok/s | CPU ms/step | CPU tok/s per core | CPU ratio to first |")
    print("| ---: | --- | ---: | ---: | ---: | ---: |")
    for batch in args.batch:
        results: dict[str, list] = {w: [] for w in runners}
        for _ in range(args.rounds):
            for w, runner in runners.items():
                results[w].append(measure_decode(runner, batch, args.context, args.steps))
        first = None
        for w, rounds in results.items():
            wall = statistics.median(r.tokens_per_s for r in rounds)
            cpu_ms = statistics.median(r.median_cpu_ms_per_step for r in rounds)
            first = first or cpu_ms
            label = f"{w} -> {runners[w].config.linear_format or runners[w].config.dtype}"
            print(f"| {batch} | {label} | {wall:.1f} | {cpu_ms:.1f} | {1000 * batch / cpu_ms:.1f} | {cpu_ms / first:.2f} |",
                  flush=True)
    print(f"# load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
