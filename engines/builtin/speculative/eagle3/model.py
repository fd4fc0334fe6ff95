"""The EAGLE-3 draft head as published (Li et al. 2025; SGLang's and TensorRT-LLM's layout).

    fused  = fc(concat(h_low, h_mid, h_high))                     [T, D]   (target hidden states)
    x      = concat(input_layernorm(embed(token)), hidden_norm(fused))   [T, 2D]
    h      = fused + o(attention(q(x), k(x), v(x)))               [T, D]
    out    = h + mlp(post_attention_layernorm(h))                 [T, D]   (fed back as `fused` for the next draft)
    logits = lm_head(norm(out))                                   [T, draft_vocab]; target id = i + d2t[i]

The token at position p is the one after the target position whose hidden state it is paired with
(hidden of p, embedding of token p+1): the output at p drafts token p+2. Weights keep Hugging Face
names and layout (q/k rows not interleaved; rope by rotate-half), so `state_dict()` is the
checkpoint. The target's embedding is shared, not owned: it is an attribute, never saved.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engines.builtin.speculative.eagle3.config import Eagle3Config


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)


class MLP(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # Module.__call__ is untyped
        return out


class MidLayer(nn.Module):
    def __init__(self, c: Eagle3Config) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mlp = MLP(c)


class Eagle3Head(nn.Module):
    """Parameters and the pieces of one draft step; the training loop (train.py) and the proposer
    (proposer.py) run attention themselves, over all positions or over a per-sequence cache."""

    d2t: Tensor  # buffers, registered in __init__
    t2d: Tensor
    inv_freq: Tensor

    def __init__(self, config: Eagle3Config, embed: Tensor | None = None) -> None:
        super().__init__()
        self.config = config
        c = config
        self.fc = nn.Linear(c.fc_in_features, c.hidden_size, bias=False)
        self.midlayer = MidLayer(c)
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(c.vocab_size, dtype=torch.bool))
        self.embed = embed  # [V, D] the target's, shared; not a parameter
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # ---- one step, in pieces ------------------------------------------------------------

    def layer_input(self, token_ids: Tensor, fused: Tensor) -> Tensor:
        # token_ids [T], fused [T, D] -> [T, 2D]
        assert self.embed is not None, "the head needs the target's embedding (pass embed=)"
        embeds = F.embedding(token_ids, self.embed).to(fused.dtype)
        return torch.cat([self.midlayer.input_layernorm(embeds), self.midlayer.hidden_norm(fused)], dim=-1)

    def qkv(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        # x [T, 2D] -> q [T, H, hd], k [T, KH, hd], v [T, KH, hd]; q and k rotated for `positions`
        c, attn = self.config, self.midlayer.self_attn
        t = x.shape[0]
        q = attn.q_proj(x).view(t, c.num_heads, c.head_dim)
        k = attn.k_proj(x).view(t, c.num_kv_heads, c.head_dim)
        v = attn.v_proj(x).view(t, c.num_kv_heads, c.head_dim)
        cos, sin = self.rope(positions, x.dtype)
        return rotate(q, cos, sin), rotate(k, cos, sin), v

    def rope(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        # positions [T] -> cos, sin [T, 1, hd]
        angles = positions.float()[:, None] * self.inv_freq[None, :]  # [T, hd/2]
        angles = torch.cat([angles, angles], dim=-1)[:, None, :]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def after_attention(self, fused: Tensor, attn_out: Tensor) -> Tensor:
        # fused [T, D], attn_out [T, H*hd] -> out [T, D] (before the final norm)
        h: Tensor = fused + self.midlayer.self_attn.o_proj(attn_out)
        mlp_out: Tensor = self.midlayer.mlp(self.midlayer.post_attention_layernorm(h))
        return h + mlp_out

    def logits(self, out: Tensor) -> Tensor:
        # out [T, D] -> [T, draft_vocab]
        logits: Tensor = self.lm_head(self.norm(out))
        return logits

    def to_target(self, draft_ids: Tensor) -> Tensor:
        return draft_ids + self.d2t[draft_ids]



def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # Hugging Face rope: x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x2, x1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin
