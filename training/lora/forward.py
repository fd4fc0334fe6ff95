"""The engine's Llama forward over padded rows, differentiable, with LoRA deltas on chosen modules.

The serving forward (engines/builtin/runner/model.py) works in place on a paged cache; training needs
autograd through the adapted layers, so this is the same maths over whole sequences [B, T] without in-place
ops: plain causal attention (right padding never reaches a real token), rope on the runtime's
interleaved q/k rows, and `W x + s * B (A x)` added to the PEFT module's columns of the runtime's
fused linear (loader.peft.module_columns). Only the LoRA tensors take gradients. An adapter of the top
layers only (PEFT's layers_to_transform) trains from the residual stream below them, computed once per
row (`embed_prefix`): on two CPU cores that is what makes a few hundred steps take minutes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.builtin.loader.peft import base_shape, module_columns
from engines.builtin.runner.model import rms_norm, rope_freqs_cis, rope_inv_freq
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.runner.weights import LlamaWeights


@dataclass(slots=True)
class LoraParams:
    """Per (layer, PEFT module): A [r, in] and B [out, r], B's rows in runtime layout (q/k rope-interleaved)."""

    rank: int
    alpha: float
    targets: tuple[str, ...]
    weights: dict[tuple[int, str], tuple[Tensor, Tensor]]

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def init(cls, config: ModelConfig, rank: int, alpha: float, targets: tuple[str, ...], layers: range, seed: int) -> LoraParams:
        """PEFT's start: A small random (Kaiming-uniform bound 1/sqrt(in)), B zero, so step 0 is the base model."""
        generator = torch.Generator().manual_seed(seed)
        weights: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}
        for layer in layers:
            for module in sorted(targets):
                out, fan_in = base_shape(config).modules[module]
                a = (torch.rand(rank, fan_in, generator=generator) * 2 - 1) * fan_in ** -0.5
                weights[(layer, module)] = (a.requires_grad_(), torch.zeros(out, rank, requires_grad=True))
        return cls(rank, alpha, tuple(sorted(targets)), weights)

    def parameters(self) -> list[Tensor]:
        return [t for pair in self.weights.values() for t in pair]


def lora_linear(x: Tensor, w: Tensor, lora: LoraParams, layer: int, linear: str, config: ModelConfig) -> Tensor:
    # x [B, T, in] -> x @ w.T plus s * (x A^T) B^T in each adapted module's columns   [B, T, out]
    y = F.linear(x, w)
    for module in lora.targets:
        name, start, end = module_columns(config)[module]
        if name != linear:
            continue
        a, b = lora.weights[(layer, module)]
        delta = F.linear(F.linear(x, a), b) * lora.scale  # [B, T, end - start]
        y = y + F.pad(delta, (start, y.shape[-1] - end))
    return y


def rope(x: Tensor, freqs_cis: Tensor) -> Tensor:
    # x [B, T, heads, hd] rope-interleaved, freqs_cis [T, 1, hd/2] -> rotated copy
    rotated = torch.view_as_complex(torch.unflatten(x.float(), -1, (-1, 2))) * freqs_cis
    return torch.view_as_real(rotated).flatten(-2)


def embed_prefix(weights: LlamaWeights, config: ModelConfig, token_ids: Tensor, num_layers: int) -> Tensor:
    # token_ids [B, T] (right-padded) -> the residual stream after the first num_layers layers, no LoRA,
    # no autograd   [B, T, D]
    lora = LoraParams(1, 1.0, (), {})
    with torch.no_grad():
        return decoder_layers(weights, config, lora, F.embedding(token_ids, weights.embed), range(num_layers))


def decoder_layers(weights: LlamaWeights, config: ModelConfig, lora: LoraParams, x: Tensor, layers: range) -> Tensor:
    # x [B, T, D] (right-padded rows) -> the residual stream after `layers`   [B, T, D]
    b, t, _ = x.shape
    h, kh, hd = config.num_heads, config.num_kv_heads, config.head_dim
    freqs_cis = rope_freqs_cis(torch.arange(t), rope_inv_freq(config, x.device))
    for i in layers:
        layer = weights.layers[i]
        assert isinstance(layer.qkv, Tensor), "training reads plain float32 weights"
        qkv = lora_linear(rms_norm(x, layer.attn_norm, config.rms_norm_eps), layer.qkv, lora, i, "qkv", config)
        q = rope(qkv[..., : h * hd].view(b, t, h, hd), freqs_cis).transpose(1, 2)  # [B, H, T, hd]
        k = rope(qkv[..., h * hd : (h + kh) * hd].view(b, t, kh, hd), freqs_cis).transpose(1, 2)
        v = qkv[..., (h + kh) * hd :].view(b, t, kh, hd).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).reshape(b, t, h * hd)
        x = x + lora_linear(out, layer.o, lora, i, "o", config)  # type: ignore[arg-type]
        gate, up = lora_linear(rms_norm(x, layer.mlp_norm, config.rms_norm_eps), layer.gate_up, lora, i, "gate_up",  # type: ignore[arg-type]
                               config).chunk(2, dim=-1)
        x = x + lora_linear(F.silu(gate) * up, layer.down, lora, i, "down", config)  # type: ignore[arg-type]
    return x
