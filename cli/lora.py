"""`edgerun lora train --out DIR [--steps N]`: a LoRA adapter for the built-in engine's model, as PEFT files.

By default it trains on data/french_qa.json, so that the model answers in French (the example adapter
in data/lora/french/ is this command's output); `--pairs FILE` takes any JSON list of [question, answer].
The directory it writes uploads through the finetunes API or serves from `--lora-dir`.
The work lives in training/lora/train.py; this module only parses.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="lora_command", metavar="ACTION", required=True)
    train = sub.add_parser("train", help="train a LoRA adapter on question/answer pairs and write it as PEFT files")
    train.add_argument("--out", type=Path, required=True, help="adapter directory (adapter_config.json + adapter_model.safetensors)")
    train.add_argument("--model", default="smollm2", help="base model, as for `edgerun backend --model`")
    train.add_argument("--pairs", type=Path, default=None, help="JSON list of [question, answer] (default data/french_qa.json)")
    train.add_argument("--steps", type=int, default=200)
    train.add_argument("--rank", type=int, default=8)
    train.add_argument("--targets", default="q_proj,v_proj", help="comma-separated PEFT module names")
    train.add_argument("--top-layers", type=int, default=10, help="adapt the model's last N layers")
    train.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: one per core)")


def logging_options(args: argparse.Namespace) -> dict[str, object]:
    return {"json": False}


def run(args: argparse.Namespace) -> int:
    import torch

    from training.lora.pairs import FRENCH_PAIRS
    from training.lora.train import LoraTrainConfig, train_adapter

    if args.threads:
        torch.set_num_threads(args.threads)
    config = LoraTrainConfig(rank=args.rank, alpha=2.0 * args.rank, targets=tuple(args.targets.split(",")),
                             num_top_layers=args.top_layers, num_steps=args.steps, log_every=10)
    print(json.dumps(train_adapter(args.out, args.model, config, args.pairs or FRENCH_PAIRS)))
    return 0
