"""Read a Hugging Face Llama checkpoint directory: config.json, *.safetensors, tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from torch import Tensor

from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.text.tokenizer import Tokenizer

SUPPORTED_MODEL_TYPES = {"llama", "mistral"}


def read_hf_config(directory: Path) -> dict[str, Any]:
    hf: dict[str, Any] = json.loads((directory / "config.json").read_text())
    model_type = hf.get("model_type", "llama")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{directory}: model_type {model_type!r} is not supported; the built-in engine runs Llama-family models")
    generation = directory / "generation_config.json"
    if generation.exists():  # instruct models list their end-of-turn ids here
        eos = json.loads(generation.read_text()).get("eos_token_id")
        if eos is not None:
            hf["eos_token_id"] = eos
    return hf


def read_safetensors_dir(directory: Path) -> tuple[ModelConfig, dict[str, Tensor], Tokenizer, str]:
    """(config, Hugging Face-layout weights, tokenizer, model name) of a checkpoint directory."""
    config = ModelConfig.from_hf(read_hf_config(directory))
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory} has config.json but no *.safetensors weights")
    weights: dict[str, Tensor] = {}
    for file in files:
        weights.update(load_file(file))
    if not (directory / "tokenizer.json").exists():
        raise FileNotFoundError(f"{directory} has no tokenizer.json; save the model's tokenizer next to its weights")
    tokenizer = Tokenizer.load(directory, eos_token_id=config.eos_token_ids[0] if config.eos_token_ids else None)
    return config, weights, tokenizer, directory.name
