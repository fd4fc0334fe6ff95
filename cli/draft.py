"""`edgerun draft train|eval`: train an EAGLE-3 head for the built-in engine's model, or measure one.

    edgerun draft train [--out DIR]    self-distillation data (cached, resumable) + training-time-test training
    edgerun draft eval  [--head DIR]   mean accepted length at k = 1..4 on held-out prompts

The work lives in training/eagle3/pipeline.py; this module only parses.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# the same as eagle3.pipeline.DEFAULT_OUT, spelled here so that parsing arguments imports no torch
DEFAULT_OUT = Path.home() / ".cache" / "edgerun" / "eagle3" / "smollm2"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="draft_command", metavar="ACTION", required=True)
    train = sub.add_parser("train", help="generate self-distillation data with the target and train a head")
    train.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"head directory, data and state cached inside (default {DEFAULT_OUT})"
    )
    train.add_argument("--model", default="smollm2", help="target model, as for `edgerun backend --model`")
    train.add_argument("--epochs", type=int, default=2)
    train.add_argument("--draft-vocab-size", type=int, default=4096, help="most frequent answer tokens the head can draft")
    train.add_argument("--ttt-steps", type=int, default=3, help="unrolled draft steps per training row (training-time test)")
    train.add_argument("--max-tokens", type=int, default=256, help="answer length cap while generating data")
    train.add_argument("--num-prompts", type=int, default=None, help="use only the first N training prompts")
    train.add_argument("--data-minutes", type=float, default=None,
                       help="start no new data shard after this many minutes (cached shards always count; default: all prompts)")
    train.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: one per core)")
    evaluate = sub.add_parser("eval", help="mean accepted length at k=1..4 on held-out prompts")
    evaluate.add_argument("--head", type=Path, default=DEFAULT_OUT, help="EAGLE-3 head directory")
    evaluate.add_argument("--model", default="smollm2")
    evaluate.add_argument("--max-tokens", type=int, default=256)
    evaluate.add_argument("--threads", type=int, default=None)


def logging_options(args: argparse.Namespace) -> dict[str, object]:
    return {"json": False}


def run(args: argparse.Namespace) -> int:
    import torch

    from training.eagle3 import pipeline
    from training.eagle3.train import TrainConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    report: pipeline.TrainReport | pipeline.EvalReport
    if args.draft_command == "train":
        config = TrainConfig(draft_vocab_size=args.draft_vocab_size, num_epochs=args.epochs, num_ttt_steps=args.ttt_steps)
        report = pipeline.train_pipeline(args.out, args.model, config, args.max_tokens, args.num_prompts, args.threads,
                                         None if args.data_minutes is None else 60 * args.data_minutes)
    else:
        report = pipeline.eval_pipeline(args.head, args.model, args.max_tokens, args.threads)
    print(json.dumps(report))
    return 0
