"""The Llama forward pass in plain PyTorch, as small functions in the gpt-fast manner.

One call runs the new tokens of every sequence in a step, packed into one flat batch [T, D] for the
matmuls; attention over the paged KV cache is in `attention.py`, the weight layout in `weights.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.builtin.runner.attention import AttentionMetadata, paged_attention, write_kv
from engines.builtin.runner.linear import Linear
from engines.builtin.runner.lora import LoraBatch
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.runner.weights import LayerWeights, LlamaWeights


def rope_inv_freq(config: ModelConfig, device: torch.device) -> Tensor:
    # inv_freq[i] = theta^(-2i/hd) / factor[i]   [hd/2], float32
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    if config.rope_freq_factors is not None:
        inv_freq = inv_freq / torch.tensor(config.rope_freq_factors, dtype=torch.float32)
    return inv_freq.to(device)


def rope_freqs_cis(positions: Tensor, inv_freq: Tensor) -> Tensor:
    # positions [T] -> e^(i * pos * inv_freq)   [T, 1, hd/2] complex64 (broadcasts over heads)
    angles = positions.float()[:, None] * inv_freq[None, :]
    return torch.polar(torch.ones_like(angles), angles)[:, None, :]


def apply_rope_(qk: Tensor, freqs_cis: Tensor) -> None:
    # qk: [T, heads, hd] view of the qkv buffer, rope-interleaved; rotated in place.
    if qk.dtype == torch.float32:
        torch.view_as_complex(torch.unflatten(qk, -1, (-1, 2))).mul_(freqs_cis)
    else:  # no complex bf16: rotate in float32, write back
        rotated = torch.view_as_complex(torch.unflatten(qk.float(), -1, (-1, 2))) * freqs_cis
        qk.copy_(torch.view_as_real(rotated).flatten(-2))


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)


def linear(x: Tensor, w: Linear) -> Tensor:
    # x: [T, in] -> x @ w.T   [T, out]
    return F.linear(x, w) if isinstance(w, Tensor) else w(x)


def residual_linear(x: Tensor, a: Tensor, w: Linear) -> Tensor:
    # x + a @ w.T, in one BLAS call for a float weight
    return torch.addmm(x, a, w.t()) if isinstance(w, Tensor) else x + w(a)


def lora_linear(x: Tensor, w: Linear, lora: LoraBatch | None, index: int, name: str) -> Tensor:
    # linear(x, w), plus the LoRA delta of the rows that run under an adapter (lora.py)
    y = linear(x, w)
    if lora is not None:
        lora.apply(index, name, x, y)
    return y


def attention_block(
    x: Tensor, layer: LayerWeights, kv_cache: Tensor, meta: AttentionMetadata, freqs_cis: Tensor, config: ModelConfig,
    lora: LoraBatch | None = None, index: int = 0,
) -> Tensor:
    # x: [T, D] -> x + attention(x)   [T, D]; `lora`: per-row adapters, `index` this layer's
    num_tokens = x.shape[0]
    h, kh, hd = config.num_heads, config.num_kv_heads, config.head_dim
    qkv = lora_linear(rms_norm(x, layer.attn_norm, config.rms_norm_eps), layer.qkv, lora, index, "qkv")  # [T, (H + 2KH) * hd]
    apply_rope_(qkv[:, : (h + kh) * hd].view(num_tokens, h + kh, hd), freqs_cis)
    write_kv(kv_cache, qkv[:, h * hd :].view(num_tokens, 2, kh, hd), meta)
    out = paged_attention(qkv[:, : h * hd], kv_cache, meta)  # [T, H*hd]
    y = residual_linear(x, out, layer.o)
    if lora is not None:
        lora.apply(index, "o", out, y)
    return y


def mlp_block(x: Tensor, layer: LayerWeights, config: ModelConfig, lora: LoraBatch | None = None, index: int = 0) -> Tensor:
    # x: [T, D] -> x + down(silu(gate(x)) * up(x))   [T, D]
    gate_up = lora_linear(rms_norm(x, layer.mlp_norm, config.rms_norm_eps), layer.gate_up, lora, index, "gate_up")  # [T, 2I]
    gate, up = gate_up.chunk(2, dim=-1)
    act = F.silu(gate, inplace=True).mul_(up)
    y = residual_linear(x, act, layer.down)
    if lora is not None:
        lora.apply(index, "down", act, y)
    return y


def forward(
    weights: LlamaWeights,
    config: ModelConfig,
    kv_caches: list[Tensor],
    token_ids: Tensor,
    freqs_cis: Tensor,
    meta: AttentionMetadata,
    logit_indices: Tensor,
    aux_layers: tuple[int, ...] = (),
    lora: LoraBatch | None = None,
) -> tuple[Tensor, Tensor | None]:
    # token_ids [T] (all sequences' new tokens, packed) -> logits of the rows logit_indices [N, V] float32,
    # and the residual stream after each layer of aux_layers, joined [T, len(aux_layers) * D] (None without);
    # `lora`: the rows that run under an adapter (None: none does)
    x = F.embedding(token_ids, weights.embed)  # [T, D]
    captured: dict[int, Tensor] = {}
    for i, (layer, kv_cache) in enumerate(zip(weights.layers, kv_caches)):
        x = attention_block(x, layer, kv_cache, meta, freqs_cis, config, lora, i)
        x = mlp_block(x, layer, config, lora, i)  # a new tensor each block: a captured one is never overwritten
        if i in aux_layers:
            captured[i] = x
    aux = torch.cat([captured[i] for i in aux_layers], dim=-1) if aux_layers else None
    x = rms_norm(x[logit_indices], weights.norm, config.rms_norm_eps)  # [N, D]
    return linear(x, weights.lm_head).float(), aux
