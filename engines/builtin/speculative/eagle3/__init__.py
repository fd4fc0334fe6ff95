"""EAGLE-3 draft heads as the engine serves them: the model, its checkpoint format, the proposer.

    config.py       the head's shape and config.json, as SGLang and TensorRT-LLM read it
    model.py        the head's forward pass (Hugging Face names and layout)
    checkpoint.py   reading head directories (config.json + model.safetensors)
    proposer.py     chain drafts from a head, with its own KV cache per sequence

`load_proposer(path, target_config, device, dtype, embed)` is what the engine's proposer factory calls.
Training a head is the top-level `training.eagle3` package's (`edgerun draft`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from engines.builtin.config import fp16_gemm_available
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.speculative.eagle3.checkpoint import HeadFormatError, load_head
from engines.builtin.speculative.eagle3.proposer import Eagle3Proposer

__all__ = ["Eagle3Proposer", "HeadFormatError", "load_proposer"]


def load_proposer(path: str | Path, target_config: ModelConfig, device: str | torch.device = "cpu",
                  dtype: torch.dtype = torch.float32, embed: Tensor | None = None,
                  fp16_weights: bool = True) -> Eagle3Proposer:
    """An `Eagle3Proposer` over the head in `path`, on `device` in `dtype`; `embed` is the target's
    embedding weight [V, D] (shared, not copied). On a CPU in float32 the head's linear weights are
    held as float16 (as the engine holds the target's) unless `fp16_weights` is False.
    Raises HeadFormatError if the head does not fit the target."""
    head = load_head(Path(path), target_config.num_layers, embed)
    c = head.config
    if c.vocab_size != target_config.vocab_size:
        raise HeadFormatError(
            f"{path}: the head's vocab_size {c.vocab_size} differs from the target's {target_config.vocab_size}"
        )
    if (c.target_hidden_size or c.hidden_size) != target_config.hidden_size:
        raise HeadFormatError(
            f"{path}: the head reads hidden size {c.target_hidden_size or c.hidden_size}, "
            f"the target has {target_config.hidden_size}"
        )
    if max(c.aux_layers) >= target_config.num_layers:
        raise HeadFormatError(f"{path}: aux layers {c.aux_layers} exceed the target's {target_config.num_layers} layers")
    shared, head.embed = head.embed, None
    assert shared is not None, "load_head gives every head an embedding"
    head = head.to(device=device, dtype=dtype)  # floating point tensors only: d2t and t2d keep their types
    head.embed = shared.to(device=device)  # a no-op for the target's own embedding
    on_cpu_float32 = head.norm.weight.device.type == "cpu" and dtype == torch.float32
    return Eagle3Proposer(head, fp16_weights=fp16_weights and on_cpu_float32 and fp16_gemm_available())
