"""Random LoRA adapters written as PEFT files (the test fixtures), and the merged model they must equal."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from contracts.lora_adapter import CONFIG_FILE, MODULES, WEIGHTS_FILE, BaseShape
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.runner.weights import LlamaWeights, hf_to_runtime, runtime_to_hf

ALL_MODULES = tuple(MODULES)


def base_shape(config: ModelConfig) -> BaseShape:
    return BaseShape.llama(config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads,
                           config.head_dim, config.intermediate_size)


def write_adapter(
    directory: Path, config: ModelConfig, rank: int = 8, targets: tuple[str, ...] = ("q_proj", "v_proj"),
    seed: int = 0, alpha: float | None = None, std: float = 0.1,
) -> Path:
    """A PEFT adapter of random A and B (both nonzero, so it changes the output) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    shapes = base_shape(config).modules
    tensors: dict[str, Tensor] = {}
    for layer in range(config.num_layers):
        for module in targets:
            out, inp = shapes[module]
            prefix = f"base_model.model.model.layers.{layer}.{MODULES[module]}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, inp, generator=generator) * std
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out, rank, generator=generator) * std
    save_file(tensors, str(directory / WEIGHTS_FILE))
    peft_config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha if alpha is not None else 2 * rank,
                   "target_modules": list(targets), "bias": "none", "base_model_name_or_path": "test"}
    (directory / CONFIG_FILE).write_text(json.dumps(peft_config))
    return directory


def merged_weights(weights: LlamaWeights, config: ModelConfig, directory: Path) -> LlamaWeights:
    """A copy of plain-tensor `weights` with the adapter in `directory` merged in (W += s * B A), done in
    Hugging Face layout from the PEFT files alone, so the runtime layout's conversions are checked too."""
    from safetensors.torch import load_file

    state: dict[str, Tensor] = {"embed": weights.embed, "norm": weights.norm}
    for i, layer in enumerate(weights.layers):
        for name in ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down"):
            tensor = getattr(layer, name)
            assert isinstance(tensor, Tensor), "merging needs plain weights (deterministic mode)"
            state[f"layers.{i}.{name}"] = tensor
    hf = {k: v.clone() for k, v in runtime_to_hf(state, config).items()}
    peft = json.loads((directory / CONFIG_FILE).read_text())
    scale = peft["lora_alpha"] / peft["r"]
    tensors = load_file(str(directory / WEIGHTS_FILE))
    for name, a in tensors.items():
        if ".lora_A." in name:
            b = tensors[name.replace(".lora_A.", ".lora_B.")]
            target = name.split(".lora_A.")[0].removeprefix("base_model.model.") + ".weight"
            hf[target] += scale * (b @ a)
    return LlamaWeights.from_state_dict(hf_to_runtime(hf, config), config)
