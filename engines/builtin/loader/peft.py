"""A PEFT LoRA adapter directory read into the runtime layout of the model it adapts.

The format and what is served are `contracts.lora_adapter`'s (the gateway checks the same on upload).
Here the scale `s` is folded into B once, and q/k's B rows are rope-interleaved like the weights they
add to (weights.py), so the runner adds `B (A x)` to its module's columns of the fused qkv / gate_up
output (`module_columns`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from contracts.lora_adapter import (
    CONFIG_FILE,
    KEY,
    MAX_RANK,
    WEIGHTS_FILE,
    AdapterConfig,
    AdapterError,
    BaseShape,
    check_tensors,
    pair_name,
    parse_config,
)
from engines.builtin.runner.model_config import ModelConfig


def base_shape(config: ModelConfig) -> BaseShape:
    return BaseShape.llama(config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
                           config.head_dim, config.intermediate_size)


def module_columns(config: ModelConfig) -> dict[str, tuple[str, int, int]]:
    """PEFT module -> (runtime linear, first output column, end column) it adds to."""
    q, kv, i = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim, config.intermediate_size
    d = config.hidden_size
    return {"q_proj": ("qkv", 0, q), "k_proj": ("qkv", q, q + kv), "v_proj": ("qkv", q + kv, q + 2 * kv),
            "o_proj": ("o", 0, d), "gate_proj": ("gate_up", 0, i), "up_proj": ("gate_up", i, 2 * i),
            "down_proj": ("down", 0, d)}


@dataclass(slots=True)
class LoraAdapter:
    """An adapter in runtime layout: per (layer, PEFT module) A [r, in] and B [out, r], the scale folded into B."""

    name: str
    config: AdapterConfig
    weights: dict[tuple[int, str], tuple[Tensor, Tensor]]

    @property
    def rank(self) -> int:
        return self.config.rank


def load_adapter(directory: Path, model: ModelConfig, name: str | None = None, max_rank: int = MAX_RANK) -> LoraAdapter:
    """Read and check a PEFT adapter directory; raises FileNotFoundError or AdapterError."""
    from safetensors.torch import load_file

    from engines.builtin.runner.weights import interleave_rope_rows

    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    if not config_path.is_file() or not weights_path.is_file():
        raise FileNotFoundError(f"{directory} needs {CONFIG_FILE} and {WEIGHTS_FILE}")
    try:
        raw = json.loads(config_path.read_text())
    except ValueError as exc:
        raise AdapterError(f"{CONFIG_FILE} is not valid JSON: {exc}") from exc
    config = parse_config(raw, max_rank)
    tensors = load_file(weights_path)
    check_tensors(config, {k: tuple(t.shape) for k, t in tensors.items()}, base_shape(model))
    heads = {"q_proj": model.num_heads, "k_proj": model.num_kv_heads}
    weights: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}
    for key, a in tensors.items():
        match = KEY.match(key)
        assert match is not None, "check_tensors accepted every name"
        if match[4] != "A":
            continue
        layer, module = int(match[1]), match[3]
        b = tensors[pair_name(key)].float() * config.scale
        if module in heads:
            b = interleave_rope_rows(b, heads[module])
        weights[(layer, module)] = (a.float().contiguous(), b.contiguous())
    return LoraAdapter(name or directory.name, config, weights)
