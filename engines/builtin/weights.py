"""Model weights in the runtime layout, and the one conversion from Hugging Face names and layout.

    qkv      [(H + 2*KH) * hd, D]  q, k and v projections stacked; the q and k rows of each head are
                                   interleaved for rotary embedding (pairs (x[j], x[j + hd/2]) of the
                                   Hugging Face layout sit side by side, as in llama.cpp), so rope is
                                   one complex multiply done in place
    gate_up  [2*I, D]              gate and up projections stacked
    o [D, H*hd], down [D, I], norms [D], embed [V, D], lm_head [V, D] (the embedding when tied)

Every loader produces Hugging Face names and layout first; `hf_to_runtime` turns them into this one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from engines.builtin.model_config import ModelConfig


@dataclass(slots=True, eq=False)
class PackedFp16Linear:
    """A [out, in] weight held as float16, prepacked for fbgemm's fp16 GEMM (CPU).

    Decoding reads every weight once per token, so on a CPU it runs at memory bandwidth (SmolLM2-135M:
    540 MB of float32 per token, ~20 tokens/s at 10 GB/s). fbgemm keeps the weight in float16 and
    widens it to float32 in registers: activations and accumulation stay float32, so the only change
    from the float32 model is the weights' rounding to float16 (relative 2^-11), and on AVX2 it is
    faster than float32 BLAS at every batch size.

    It calls the ATen fbgemm ops (a few microseconds per call) rather than torch.ops.quantized's
    (~25 us: boxed custom-class dispatch). torch marks them deprecated; torch is pinned in pyproject.
    """

    packed: Tensor  # opaque fbgemm handle
    bias: Tensor  # [out] zeros: the op takes one

    @classmethod
    def from_weight(cls, weight: Tensor) -> PackedFp16Linear:
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise RuntimeError("weight_dtype='float16' needs a torch build with fbgemm (x86 CPU)")
        with warnings.catch_warnings():  # the deprecation notice, once per process
            warnings.simplefilter("ignore", UserWarning)
            packed = torch.fbgemm_pack_gemm_matrix_fp16(weight.float().contiguous())
            out = cls(packed, torch.zeros(weight.shape[0]))
            out(torch.zeros(1, weight.shape[1]))
        return out

    def __call__(self, x: Tensor) -> Tensor:
        # x: [T, in] float32 -> [T, out] float32
        return torch.fbgemm_linear_fp16_weight(x.contiguous(), self.packed, self.bias)


Linear = Tensor | PackedFp16Linear


@dataclass(slots=True)
class LayerWeights:
    attn_norm: Tensor  # [D]
    qkv: Linear  # [(H + 2*KH) * hd, D], q/k rows rope-interleaved
    o: Linear  # [D, H*hd]
    mlp_norm: Tensor  # [D]
    gate_up: Linear  # [2*I, D]
    down: Linear  # [D, I]


@dataclass(slots=True)
class LlamaWeights:
    embed: Tensor  # [V, D]
    layers: list[LayerWeights]
    norm: Tensor  # [D]
    lm_head: Linear  # [V, D]; the same tensor as embed when tied

    @classmethod
    def from_state_dict(cls, state: dict[str, Tensor], config: ModelConfig) -> LlamaWeights:
        """From runtime-layout names (see `hf_to_runtime`)."""
        layers = [
            LayerWeights(*(state[f"layers.{i}.{name}"] for name in ("attn_norm", "qkv", "o", "mlp_norm", "gate_up", "down")))
            for i in range(config.num_layers)
        ]
        embed = state["embed"]
        lm_head = embed if config.tie_word_embeddings else state["lm_head"]
        return cls(embed=embed, layers=layers, norm=state["norm"], lm_head=lm_head)

    def pack_fp16(self) -> None:
        """Hold every linear weight as fbgemm-packed float16 (see PackedFp16Linear); the embedding
        lookup keeps its float32 table."""
        for layer in self.layers:
            for name in ("qkv", "o", "gate_up", "down"):
                setattr(layer, name, PackedFp16Linear.from_weight(getattr(layer, name)))
        self.lm_head = PackedFp16Linear.from_weight(self.lm_head)


HF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "mlp_norm": "post_attention_layernorm",
    "o": "self_attn.o_proj",
    "down": "mlp.down_proj",
}


def interleave_rope_rows(w: Tensor, num_heads: int) -> Tensor:
    """Hugging Face q/k rows (per head: all first halves, then all second halves) -> pairs side by side."""
    rows, cols = w.shape
    return w.view(num_heads, 2, rows // num_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def deinterleave_rope_rows(w: Tensor, num_heads: int) -> Tensor:
    """The inverse of `interleave_rope_rows` (llama.cpp's GGUF q/k layout -> Hugging Face's)."""
    rows, cols = w.shape
    return w.view(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def hf_to_runtime(hf: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Hugging Face Llama names and layout -> runtime names and layout (fused, rope-interleaved)."""
    out = {"embed": hf["model.embed_tokens.weight"], "norm": hf["model.norm.weight"]}
    if not config.tie_word_embeddings:
        out["lm_head"] = hf["lm_head.weight"]
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        for name, hf_name in HF_LAYER_NAMES.items():
            out[f"layers.{i}.{name}"] = hf[f"{p}{hf_name}.weight"]
        q = interleave_rope_rows(hf[f"{p}self_attn.q_proj.weight"], config.num_heads)
        k = interleave_rope_rows(hf[f"{p}self_attn.k_proj.weight"], config.num_kv_heads)
        out[f"layers.{i}.qkv"] = torch.cat([q, k, hf[f"{p}self_attn.v_proj.weight"]])
        out[f"layers.{i}.gate_up"] = torch.cat([hf[f"{p}mlp.gate_proj.weight"], hf[f"{p}mlp.up_proj.weight"]])
    return out


def runtime_to_hf(state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """The inverse of `hf_to_runtime` (for exporting a checkpoint transformers can load)."""
    hd, h, kh = config.head_dim, config.num_heads, config.num_kv_heads
    out = {"model.embed_tokens.weight": state["embed"], "model.norm.weight": state["norm"]}
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = state["lm_head"]
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        for name, hf_name in HF_LAYER_NAMES.items():
            out[f"{p}{hf_name}.weight"] = state[f"layers.{i}.{name}"]
        q, k, v = state[f"layers.{i}.qkv"].split([h * hd, kh * hd, kh * hd])
        out[f"{p}self_attn.q_proj.weight"] = deinterleave_rope_rows(q, h)
        out[f"{p}self_attn.k_proj.weight"] = deinterleave_rope_rows(k, kh)
        out[f"{p}self_attn.v_proj.weight"] = v
        gate, up = state[f"layers.{i}.gate_up"].chunk(2)
        out[f"{p}mlp.gate_proj.weight"] = gate
        out[f"{p}mlp.up_proj.weight"] = up
    return {k: v.contiguous() for k, v in out.items()}
