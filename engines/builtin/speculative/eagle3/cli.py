"""`edgerun draft train|eval`: train an EAGLE-3 head for the built-in engine's model, or measure one.

    edgerun draft train [--out DIR]    self-distillation data (cached, resumable) + training-time-test training
    edgerun draft eval  [--head DIR]   mean accepted length at k = 1..4 on held-out prompts

The head directory is what `edgerun backend --speculative eagle3 --speculative-model DIR` loads.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

DEFAULT_OUT = Path.home() / ".cache" / "edgerun" / "eagle3" / "smollm2"
logger = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="draft_command", metavar="ACTION", required=True)
    train = sub.add_parser("train", help="generate self-distillation data with the target and train a head")
    train.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"head directory (data and state cached inside; default {DEFAULT_OUT})")
    train.add_argument("--model", default="smollm2", help="target model, as for `edgerun backend --model`")
    train.add_argument("--epochs", type=int, default=2)
    train.add_argument("--draft-vocab-size", type=int, default=4096)
    train.add_argument("--ttt-steps", type=int, default=3, help="unrolled draft steps per training row")
    train.add_argument("--max-tokens", type=int, default=256, help="answer length cap while generating data")
    train.add_argument("--num-prompts", type=int, default=None, help="use only the first N training prompts")
    train.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    evaluate = sub.add_parser("eval", help="mean accepted length at k=1..4 on held-out prompts")
    evaluate.add_argument("--head", type=Path, default=DEFAULT_OUT, help="EAGLE-3 head directory")
    evaluate.add_argument("--model", default="smollm2")
    evaluate.add_argument("--max-tokens", type=int, default=256)
    evaluate.add_argument("--threads", type=int, default=None)


def run(args: argparse.Namespace) -> int:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("engines").setLevel(logging.INFO)
    return train(args) if args.draft_command == "train" else evaluate(args)


def train(args: argparse.Namespace) -> int:
    from engines.builtin.speculative.eagle3.checkpoint import save_head
    from engines.builtin.speculative.eagle3.config import default_aux_layers
    from engines.builtin.speculative.eagle3.datagen import DataGenConfig, data_engine, generate_data
    from engines.builtin.speculative.eagle3.dataset import read_conversations
    from engines.builtin.speculative.eagle3.prompts import build_prompts, split
    from engines.builtin.speculative.eagle3.train import TargetParts, TrainConfig, train_head

    started = time.monotonic()
    engine = data_engine(args.model, args.threads, args.max_tokens)
    target_config = engine.runner.model_config
    aux_layers = default_aux_layers(target_config.num_layers)
    prompts, _ = split(build_prompts())
    prompts = prompts[: args.num_prompts] if args.num_prompts else prompts
    data = DataGenConfig(args.out / "data", aux_layers, max_tokens=args.max_tokens)
    paths = generate_data(engine, prompts, data)
    data_s = time.monotonic() - started
    target = target_parts(args.model)
    del engine  # the KV cache and packed weights are not needed for training
    conversations = read_conversations(paths)
    config = TrainConfig(draft_vocab_size=args.draft_vocab_size, num_epochs=args.epochs, num_ttt_steps=args.ttt_steps)
    head = train_head(conversations, target, aux_layers, config, args.out / "train_state.pt")
    save_head(head, args.out)
    report = {
        "data_seconds": round(data_s), "train_seconds": round(time.monotonic() - started - data_s),
        "conversations": len(conversations), "tokens": sum(len(c.token_ids) for c in conversations),
        "answer_tokens": sum(len(c.token_ids) - c.prompt_len for c in conversations),
        "draft_vocab_size": head.config.draft_vocab_size, "aux_layers": list(aux_layers), "epochs": args.epochs,
    }
    (args.out / "train_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))
    return 0


def evaluate(args: argparse.Namespace) -> int:
    from engines.builtin.speculative.eagle3 import load_proposer
    from engines.builtin.speculative.eagle3.config import Eagle3Config
    from engines.builtin.speculative.eagle3.datagen import DataGenConfig, data_engine, generate_data
    from engines.builtin.speculative.eagle3.dataset import read_conversations
    from engines.builtin.speculative.eagle3.evaluate import acceptance
    from engines.builtin.speculative.eagle3.prompts import build_prompts, split

    engine = data_engine(args.model, args.threads, args.max_tokens)
    target_config = engine.runner.model_config
    head_config = Eagle3Config.from_hf(json.loads((args.head / "config.json").read_text()), target_config.num_layers)
    _, held_out = split(build_prompts())
    data = DataGenConfig(args.head / "eval_data", head_config.aux_layers, max_tokens=args.max_tokens, temperatures=(0.0,))
    conversations = read_conversations(generate_data(engine, held_out, data))
    proposer = load_proposer(args.head, target_config, embed=target_parts(args.model).embed)
    result = acceptance(proposer, conversations)
    print(json.dumps({"head": str(args.head), "prompts": len(held_out), "mean_accepted_length": result.as_dict()}))
    return 0


def target_parts(model: str):
    from engines.builtin.config import EngineConfig
    from engines.builtin.loader import load_model
    from engines.builtin.speculative.eagle3.train import TargetParts

    loaded = load_model(EngineConfig(model=model))
    w = loaded.weights
    return TargetParts(loaded.config, w["embed"].float(), w["norm"].float(), w.get("lm_head", w["embed"]).float())
