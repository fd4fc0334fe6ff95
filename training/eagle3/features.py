"""The target's hidden states over whole sequences, for training a draft head.

One teacher-forced pass per sequence with plain causal attention (no paged cache: the sequence is
known), reusing the engine's weights and blocks. It returns the outputs of the `aux_layers`
(the residual stream after layer i, 0-based, before the final norm; what the engine hands a
proposer) and of the last layer, from which the target's logits are recomputed when needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.builtin.runner.model import (
    apply_rope_,
    linear,
    mlp_block,
    residual_linear,
    rms_norm,
    rope_freqs_cis,
    rope_inv_freq,
)
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.runner.weights import LayerWeights, LlamaWeights


def dense_attention_block(x: Tensor, layer: LayerWeights, freqs_cis: Tensor, config: ModelConfig) -> Tensor:
    # x: [T, D] -> x + causal_attention(x)   [T, D]   (one sequence, positions 0..T-1)
    t = x.shape[0]
    h, kh, hd = config.num_heads, config.num_kv_heads, config.head_dim
    qkv = linear(rms_norm(x, layer.attn_norm, config.rms_norm_eps), layer.qkv)  # [T, (H + 2KH) * hd]
    apply_rope_(qkv[:, : (h + kh) * hd].view(t, h + kh, hd), freqs_cis)
    q = qkv[:, : h * hd].view(t, h, hd).transpose(0, 1)  # [H, T, hd]
    k = qkv[:, h * hd : (h + kh) * hd].view(t, kh, hd).transpose(0, 1)  # [KH, T, hd]
    v = qkv[:, (h + kh) * hd :].view(t, kh, hd).transpose(0, 1)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [H, T, hd]
    return residual_linear(x, out.transpose(0, 1).reshape(t, h * hd), layer.o)


@torch.inference_mode()
def target_features(weights: LlamaWeights, config: ModelConfig, token_ids: list[int], aux_layers: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """token_ids [T] -> (aux hidden [T, len(aux_layers) * D], last layer's output [T, D]), float32."""
    ids = torch.tensor(token_ids, dtype=torch.long)
    freqs_cis = rope_freqs_cis(torch.arange(len(token_ids)), rope_inv_freq(config, ids.device))
    x = F.embedding(ids, weights.embed)
    captured: dict[int, Tensor] = {}
    for i, layer in enumerate(weights.layers):
        x = dense_attention_block(x, layer, freqs_cis, config)
        x = mlp_block(x, layer, config)
        if i in aux_layers:
            captured[i] = x.clone()
    return torch.cat([captured[i] for i in aux_layers], dim=-1).float(), x.float()


def target_logits(weights: LlamaWeights, config: ModelConfig, last_hidden: Tensor) -> Tensor:
    # last layer's output [T, D] -> logits [T, V]
    return linear(rms_norm(last_hidden, weights.norm, config.rms_norm_eps), weights.lm_head).float()
