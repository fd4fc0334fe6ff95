"""How far the fast mode is from the exact model: greedy agreement and logit error over real prompts
(the comparison is tests/engines/tolerance.py's, which the fast mode's tolerance test asserts on).

    python -m benchmarks.engine.quant_tolerance --tokens 128 --rows 1 16 [--drafts 8] [--threads 2]

--drafts k: the fast runner also decodes the reference tokens as speculative verify rows of 1 + k tokens.
"""

from __future__ import annotations

import argparse
import os

import torch

from benchmarks.common import machine
from engines.builtin.config import EngineConfig
from engines.builtin.runner.model_runner import ModelRunner
from tests.engines.tolerance import compare, load_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--tokens", type=int, default=128, help="generated tokens per prompt")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16], help="decode rows per step (1: each prompt alone)")
    parser.add_argument("--drafts", type=int, nargs="*", default=[], help="also as verify rows of 1 + k tokens, per k")
    parser.add_argument("--weight-dtype", default="auto", help="the fast runner's weight_dtype")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    reference = ModelRunner(EngineConfig(model=args.model, mode="deterministic", num_kv_blocks=2048))
    subject = ModelRunner(EngineConfig(model=args.model, weight_dtype=args.weight_dtype, num_kv_blocks=2048))
    prompts = load_prompts(reference)
    print(f"# {machine(with_torch=True)}, threads={torch.get_num_threads()}, load average {os.getloadavg()}")
    print(f"# fast runner: weight_dtype={args.weight_dtype} -> {subject.config.linear_format}; "
          f"{len(prompts)} prompts x {args.tokens} tokens = {len(prompts) * args.tokens} tokens")
    for rows in args.rows:
        print(f"rows={rows}: {compare(reference, subject, prompts, args.tokens, rows).summary()}", flush=True)
        for drafts in args.drafts:
            result = compare(reference, subject, prompts, args.tokens, rows, drafts)
            print(f"rows={rows}, verify rows of 1 + {drafts}: {result.summary()}", flush=True)


if __name__ == "__main__":
    main()
