"""`edgerun export-hf`: write a model the built-in engine loads (the shipped SmolLM2 by default) as a
Hugging Face checkpoint directory, for vLLM, SGLang or trtllm-serve to serve the same weights, and
for the gateway's `tokenizer_dir`. Prints the directory (engines/builtin/loader/export.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from engines.builtin.config import EngineConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2", help="what to export, as for `edgerun backend --model`")
    parser.add_argument("--out", type=Path, default=None, help="checkpoint directory (default: ~/.cache/edgerun/hf/<model>)")
    parser.add_argument("--cache-dir", type=Path, default=EngineConfig().cache_dir, help="the engine's model cache")


def logging_options(args: argparse.Namespace) -> dict[str, object]:
    return {"json": False}


def run(args: argparse.Namespace) -> int:
    from engines.builtin.loader.export import export_hf

    try:
        directory = export_hf(EngineConfig(model=args.model, cache_dir=args.cache_dir), args.out)
    except (FileNotFoundError, ValueError) as exc:
        print(f"edgerun export-hf: {exc}")
        return 2
    print(directory)
    return 0
