"""Trained LoRA tensors written as a PEFT adapter directory (contracts.lora_adapter's format).

PEFT keeps q/k rows in Hugging Face order and B unscaled; training held B's rows in the runtime's
rope-interleaved order, so q_proj/k_proj B rows are put back (the inverse of what loader.peft does).
Weights are stored in float16: half the size, and the engine computes LoRA in float32 either way.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from contracts.lora_adapter import CONFIG_FILE, MODULES, WEIGHTS_FILE
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.runner.weights import deinterleave_rope_rows
from training.lora.forward import LoraParams


def save_adapter(directory: Path, lora: LoraParams, config: ModelConfig, base_model: str, dtype: torch.dtype = torch.float16) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    heads = {"q_proj": config.num_heads, "k_proj": config.num_kv_heads}
    tensors: dict[str, Tensor] = {}
    for (layer, module), (a, b) in sorted(lora.weights.items()):
        prefix = f"base_model.model.model.layers.{layer}.{MODULES[module]}.{module}"
        b = b.detach()
        if module in heads:
            b = deinterleave_rope_rows(b, heads[module])
        tensors[f"{prefix}.lora_A.weight"] = a.detach().to(dtype).contiguous()
        tensors[f"{prefix}.lora_B.weight"] = b.to(dtype).contiguous()
    save_file(tensors, str(directory / WEIGHTS_FILE))
    peft_config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
                   "target_modules": list(lora.targets), "lora_dropout": 0.0, "bias": "none",
                   "layers_to_transform": sorted({layer for layer, _ in lora.weights}), "base_model_name_or_path": base_model}
    (directory / CONFIG_FILE).write_text(json.dumps(peft_config, indent=2) + "\n")
    return directory
