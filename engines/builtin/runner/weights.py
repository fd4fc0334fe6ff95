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

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import Tensor

from engines.builtin.config import int4_matmul_available
from engines.builtin.runner import kernels
from engines.builtin.runner.linear import BlockLinear, Fp16Linear, Int4Linear, Linear
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.runner.quant import may_quantize_q4_1, may_quantize_q8_0


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

    def pack(self, linear_format: str, cache: dict[str, Tensor] | None = None) -> dict[str, Tensor]:
        """Hold the linear weights packed (see EngineConfig.linear_format); the embedding lookup keeps
        its float32 table. "float16": every one as Fp16Linear. "q4_1": each decoder weight that is Q4_1
        already and a Q8_0 lm_head as BlockLinear (edgerun's kernels at every row count on an AVX2-only CPU,
        4-bit and 8-bit only; on an AVX-512 one for a few rows, then Int4Linear for the decoder and Fp16Linear
        for the head), the others as Fp16Linear. "int4": each decoder weight that is Q4_1 already
        (`quant.may_quantize_q4_1`) as Int4Linear, the others and the lm_head as Fp16Linear (on an AVX-512
        CPU float16 read SmolLM2's Q8_0 head faster than torch's per-row int8 op: benchmarks/engine/quant_matmul.py).
        "int4-all": every decoder weight quantised to 4 bits.

        Finding and packing the 4-bit blocks takes seconds, so `cache` may hand back what an earlier call
        with the same format returned (every Int4Linear's and BlockLinear's tensors by
        "{name}.{part}", e.g. "layers.0.qkv.codes"; a weight absent from it is float16). Packing float16 is
        slow scalar work (~1.5 s for SmolLM2 on one core) and releases the GIL, so the weights are packed
        on as many threads as torch uses."""
        if linear_format not in ("float16", "int4", "int4-all", "q4_1"):
            raise ValueError(f"linear_format={linear_format!r}")
        if linear_format == "q4_1" and not kernels.load():
            raise RuntimeError("weight_dtype='q4_1' needs edgerun's kernels (x86 AVX2 and a C++ compiler; see the log "
                               "line above), or use weight_dtype='auto'")
        int4_wide = linear_format == "q4_1" and int4_matmul_available()

        def pack_one(key: str, weight: Tensor) -> Linear:
            if linear_format == "float16":
                return Fp16Linear.from_weight(weight)
            if linear_format == "q4_1":
                return pack_q4_1_weight(weight, int4_wide, None if cache is None else cached_parts(cache, key))
            if cache is not None:
                parts = cached_parts(cache, key)
                return Int4Linear.from_tensors(parts, weight) if parts else Fp16Linear.from_weight(weight)
            blocks = may_quantize_q4_1(weight, exact_only=linear_format == "int4")
            return Fp16Linear.from_weight(weight) if blocks is None else Int4Linear.from_blocks(*blocks)

        names = [(i, layer, name) for i, layer in enumerate(self.layers) for name in ("qkv", "o", "gate_up", "down")]
        assert isinstance(self.lm_head, Tensor), "weights are packed once, from plain tensors"
        with ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads())) as pool:
            head = self.lm_head
            q8 = q8_0_head(head, cache, lambda: Fp16Linear.from_weight(head, pool) if int4_wide else None) \
                if linear_format == "q4_1" else None
            # float16 the largest, in row chunks on every thread
            self.lm_head = q8 if q8 is not None else Fp16Linear.from_weight(head, pool)
            packed = list(pool.map(lambda item: pack_one(f"layers.{item[0]}.{item[2]}", getattr(item[1], item[2])), names))
        derived: dict[str, Tensor] = {}
        for key, linear in [("lm_head", self.lm_head), *((f"layers.{i}.{name}", linear) for (i, _, name), linear in zip(names, packed))]:
            if isinstance(linear, (Int4Linear, BlockLinear)):
                derived.update({f"{key}.{part}": t for part, t in linear.to_tensors().items()})
        for (_, layer, name), linear in zip(names, packed):
            setattr(layer, name, linear)
        return derived


def cached_parts(cache: dict[str, Tensor], key: str) -> dict[str, Tensor]:
    """The tensors `LlamaWeights.pack` stored for weight `key` ({} when it held it as float16)."""
    prefix = f"{key}."
    return {name[len(prefix):]: t for name, t in cache.items() if name.startswith(prefix)}


def q8_0_head(head: Tensor, cached: dict[str, Tensor] | None, wide: Callable[[], Fp16Linear | None]) -> BlockLinear | None:
    """The "q4_1" format's lm_head as Q8_0 blocks, from `cached` (what an earlier pack stored) when given, else
    found in the weight, with `wide()` above the kernel's rows; None when it is not Q8_0 (then it stays Fp16Linear)."""
    if cached is None:
        q8 = may_quantize_q8_0(head)
        return None if q8 is None else BlockLinear.q8_0(*q8, wide())
    parts = cached_parts(cached, "lm_head")
    return BlockLinear.from_tensors("q8_0", parts, wide()) if parts else None


def pack_q4_1_weight(weight: Tensor, int4_wide: bool, cached: dict[str, Tensor] | None) -> Linear:
    """A decoder weight in the "q4_1" format: BlockLinear when it is Q4_1 already (from `cached`, the parts
    an earlier pack stored, when given), else Fp16Linear. Above the kernel's rows torch's int4 op where it
    is fast (`int4_wide`, AVX-512); elsewhere the kernel takes every row count (BlockLinear.max_rows)."""
    if cached is None:
        q4 = may_quantize_q4_1(weight, exact_only=True)
        if q4 is None:
            return Fp16Linear.from_weight(weight)
        return BlockLinear.q4_1(*q4, Int4Linear.from_blocks(*q4) if int4_wide else None)
    if "codes" not in cached:
        return Fp16Linear.from_weight(weight)
    int4_parts: dict[str, Tensor] = {part: cached[part] for part in ("packed", "scale_zeros") if part in cached}
    wide = Int4Linear.from_tensors(int4_parts, weight) if int4_wide and int4_parts else None
    return BlockLinear.from_tensors("q4_1", cached, wide)


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


def _same_tensors(config: ModelConfig) -> Iterator[tuple[str, str]]:
    """(runtime name, Hugging Face name) of every tensor both layouts hold as it is (not fused, not permuted)."""
    yield "embed", "model.embed_tokens.weight"
    yield "norm", "model.norm.weight"
    if not config.tie_word_embeddings:
        yield "lm_head", "lm_head.weight"
    for i in range(config.num_layers):
        for name, hf_name in HF_LAYER_NAMES.items():
            yield f"layers.{i}.{name}", f"model.layers.{i}.{hf_name}.weight"


def hf_to_runtime(hf: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """Hugging Face Llama names and layout -> runtime names and layout (fused, rope-interleaved)."""
    out = {name: hf[hf_name] for name, hf_name in _same_tensors(config)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        q = interleave_rope_rows(hf[f"{p}self_attn.q_proj.weight"], config.num_heads)
        k = interleave_rope_rows(hf[f"{p}self_attn.k_proj.weight"], config.num_kv_heads)
        out[f"layers.{i}.qkv"] = torch.cat([q, k, hf[f"{p}self_attn.v_proj.weight"]])
        out[f"layers.{i}.gate_up"] = torch.cat([hf[f"{p}mlp.gate_proj.weight"], hf[f"{p}mlp.up_proj.weight"]])
    return out


def runtime_to_hf(state: dict[str, Tensor], config: ModelConfig) -> dict[str, Tensor]:
    """The inverse of `hf_to_runtime` (for exporting a checkpoint transformers can load)."""
    hd, h, kh = config.head_dim, config.num_heads, config.num_kv_heads
    out = {hf_name: state[name] for name, hf_name in _same_tensors(config)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        q, k, v = torch.split(state[f"layers.{i}.qkv"], [h * hd, kh * hd, kh * hd])
        out[f"{p}self_attn.q_proj.weight"] = deinterleave_rope_rows(q, h)
        out[f"{p}self_attn.k_proj.weight"] = deinterleave_rope_rows(k, kh)
        out[f"{p}self_attn.v_proj.weight"] = v
        gate, up = state[f"layers.{i}.gate_up"].chunk(2)
        out[f"{p}mlp.gate_proj.weight"] = gate
        out[f"{p}mlp.up_proj.weight"] = up
    return {k: v.contiguous() for k, v in out.items()}
