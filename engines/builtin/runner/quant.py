"""Weight-only quantised linear layers for the CPU fast mode: 4-bit groups of 32 and 8-bit rows.

Decoding one token reads every weight once, so at batch 1 its speed is the bytes read per token.
SmolLM2's GGUF stores its linear weights as Q4_1 (per block of 32: float16 `d` and `m`, 4-bit codes
q in [0, 15], w = d * q + m) and its tied embedding as Q8_0 (float16 `d`, int8 q, w = d * q).

Q4_1 runs through torch's CPU int4 weight-only matmul (`_weight_int4pack_mm_for_cpu`, group size 32).
Its convention is w = (q - 8) * scale + zero per group, so scale = d and zero = m + 8d: with float32
scales that reproduces d * q + m bit for bit (q - 8 and 8d are exact, so both sides are one rounding
of the same real number). The kernel is vectorised for bfloat16 activations only (float32 runs a
scalar loop ~30x slower), so scale and zero are held in bfloat16 too: the weights it sees differ
from the file's by bfloat16's rounding of d and m (relative 2^-9), and its inputs are rounded to
bfloat16. That is why this is the fast mode, not the exact one (BENCHMARKS.md states the error).

The codes are recovered from the dequantised float32 weights: llama.cpp's Q4_1 quantiser gives every
block a 0 and a 15 code (the block's min and max), so m is the block min and d = (max - min) / 15
rounded to float16, and `is_exact_q4_1` checks that re-dequantising gives back every value. SmolLM2's
GGUF passes (all 3.3M blocks); a weight that fails was not 4-bit to begin with and stays float16.

Q8_0 has one scale per 32 weights but torch's 8-bit op (`_weight_int8pack_mm`) one per output row,
so the embedding is re-quantised per row (scale = row max |w| / 127): an error of up to half a row
step per weight, measured with the rest of the fast mode.

Both kinds read packed weights only for short inputs (decode steps); a tall input (prefill, many
streams) runs a dense bfloat16 GEMM on the same dequantised values, faster once arithmetic, not
reading weights, sets the pace. The thresholds come from `benchmarks/quant_matmul.py` and
`benchmarks/quant_decode.py` on this CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

GROUP = 32  # weights per Q4_1 / Q8_0 block, along the input dimension


def q4_1_blocks(w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """[N, K] float32 -> codes [N, K] int32 in [0, 15], d [N, K/32] and m [N, K/32] float16 (llama.cpp's
    Q4_1 rule: m = block min, d = (max - min) / 15, q = round((w - m) / d))."""
    n, k = w.shape
    blocks = w.float().reshape(n, k // GROUP, GROUP)
    lo, hi = blocks.amin(-1), blocks.amax(-1)
    d, m = ((hi - lo) / 15).half(), lo.half()
    inv = torch.where(d == 0, 0.0, 1.0 / d.float())
    codes = ((blocks - m.float()[..., None]) * inv[..., None]).round_().clamp_(0, 15).to(torch.int32)
    return codes.reshape(n, k), d, m


def dequantize_q4_1(codes: Tensor, d: Tensor, m: Tensor) -> Tensor:
    # w = d * q + m in float32, as gguf's dequantiser computes it   [N, K]
    n, k = codes.shape
    w = d.float()[..., None] * codes.reshape(n, k // GROUP, GROUP).float() + m.float()[..., None]
    return w.reshape(n, k)


def is_exact_q4_1(w: Tensor) -> bool:
    """Whether `w` is a Q4_1 weight already: its blocks re-dequantise to the same float32 values."""
    return w.shape[1] % GROUP == 0 and torch.equal(dequantize_q4_1(*q4_1_blocks(w)), w.float())


def may_quantize_q4_1(w: Tensor, exact_only: bool) -> tuple[Tensor, Tensor, Tensor] | None:
    """The Q4_1 blocks of `w` (codes, d, m); None when `exact_only` and they do not reproduce it."""
    if w.shape[1] % GROUP:
        return None
    blocks = q4_1_blocks(w)
    if exact_only and not torch.equal(dequantize_q4_1(*blocks), w.float()):
        return None
    return blocks


def q8_0_blocks(w: Tensor) -> tuple[Tensor, Tensor]:
    """[N, K] float -> codes [N, K] int8 and d [N, K/32] float16 (llama.cpp's Q8_0 rule: d = block max |w|
    / 127, q = round(w / d)); for a weight that is Q8_0 already this gives back its own blocks."""
    n, k = w.shape
    blocks = w.float().reshape(n, k // GROUP, GROUP)
    d = (blocks.abs().amax(-1) / 127).half()
    inv = torch.where(d == 0, 0.0, 1.0 / d.float())
    codes = (blocks * inv[..., None]).round_().clamp_(-128, 127).to(torch.int8)
    return codes.reshape(n, k), d


def dequantize_q8_0(codes: Tensor, d: Tensor) -> Tensor:
    n, k = codes.shape
    return (d.float()[..., None] * codes.reshape(n, k // GROUP, GROUP).float()).reshape(n, k)


def may_quantize_q8_0(w: Tensor) -> tuple[Tensor, Tensor] | None:
    """The Q8_0 blocks of `w` when they reproduce it exactly (a GGUF's Q8_0 tensor), else None."""
    if w.shape[1] % GROUP:
        return None
    blocks = q8_0_blocks(w)
    return blocks if torch.equal(dequantize_q8_0(*blocks), w.float()) else None


def int4_scale_zeros(d: Tensor, m: Tensor, dtype: torch.dtype) -> Tensor:
    # the int4 op's w = (q - 8) * scale + zero  ==  d * q + m   ->   [K/32, N, 2] (scale, zero)
    d32, m32 = d.float().t(), m.float().t()
    return torch.stack([d32, m32 + 8 * d32], dim=-1).to(dtype).contiguous()


@dataclass(slots=True, eq=False)
class Int4Linear:
    """A Q4_1 [out, in] weight: packed 4-bit codes for short inputs, a dense bfloat16 copy for tall ones."""

    packed: Tensor  # [out, in / 2] uint8, the op's own layout
    scale_zeros: Tensor  # [in / 32, out, 2] bfloat16
    dense: Tensor  # [out, in] bfloat16, the dequantised weight
    dense_from_rows: int

    # from this many rows a dense bfloat16 GEMM; below, the packed op. At 16 decode rows the packed op
    # measured 1.04x float16's step time and dense bfloat16 1.18x (benchmarks/quant_decode.py), at 64
    # rows dense bfloat16 0.73x (benchmarks/quant_matmul.py)
    DENSE_FROM_ROWS = 64

    @classmethod
    def from_weight(cls, weight: Tensor) -> Int4Linear:
        """Quantised with `q4_1_blocks` (exact for a weight that is Q4_1 already)."""
        codes, d, m = q4_1_blocks(weight)
        return cls.from_blocks(codes, d, m)

    @classmethod
    def from_blocks(cls, codes: Tensor, d: Tensor, m: Tensor) -> Int4Linear:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2)
        dense = dequantize_q4_1(codes, d, m).to(torch.bfloat16)
        return cls(packed, int4_scale_zeros(d, m, torch.bfloat16), dense, cls.DENSE_FROM_ROWS)

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor], weight: Tensor) -> Int4Linear:
        """From `to_tensors()`'s output (saved in the model cache) and the dequantised float weight."""
        return cls(tensors["packed"], tensors["scale_zeros"], weight.to(torch.bfloat16), cls.DENSE_FROM_ROWS)

    def to_tensors(self) -> dict[str, Tensor]:
        return {"packed": self.packed, "scale_zeros": self.scale_zeros}

    def __call__(self, x: Tensor) -> Tensor:
        # x: [T, in] float32 -> [T, out] float32, through bfloat16
        xb = x.to(torch.bfloat16)
        if x.shape[0] >= self.dense_from_rows:
            return F.linear(xb, self.dense).float()
        out: Tensor = torch.ops.aten._weight_int4pack_mm_for_cpu(xb.contiguous(), self.packed, GROUP, self.scale_zeros)
        return out.float()  # (torch.ops is untyped: `out` is annotated so the result stays a Tensor)


@dataclass(slots=True, eq=False)
class Int8Linear:
    """An [out, in] weight as int8 with one scale per output row, with a dense bfloat16 copy for tall inputs."""

    codes: Tensor  # [out, in] int8
    scales: Tensor  # [out] bfloat16
    dense: Tensor  # [out, in] bfloat16, the original weight rounded
    dense_from_rows: int

    DENSE_FROM_ROWS = 16

    @classmethod
    def from_weight(cls, weight: Tensor, dense_from_rows: int | None = None) -> Int8Linear:
        w = weight.float()
        scales = (w.abs().amax(dim=1) / 127).clamp_(min=torch.finfo(torch.float32).tiny)  # [out]
        codes = (w / scales[:, None]).round_().clamp_(-127, 127).to(torch.int8)
        rows = cls.DENSE_FROM_ROWS if dense_from_rows is None else dense_from_rows
        return cls(codes, scales.to(torch.bfloat16), w.to(torch.bfloat16), rows)

    def __call__(self, x: Tensor) -> Tensor:
        xb = x.to(torch.bfloat16)
        if x.shape[0] >= self.dense_from_rows:
            return F.linear(xb, self.dense).float()
        out: Tensor = torch.ops.aten._weight_int8pack_mm(xb.contiguous(), self.codes, self.scales)
        return out.float()
