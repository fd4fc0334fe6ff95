"""The GGUF block formats of the CPU fast mode: finding, checking and converting 4- and 8-bit blocks.

Decoding one token reads every weight once, so at batch 1 its speed is the bytes read per token.
SmolLM2's GGUF stores its linear weights as Q4_1 (per block of 32: float16 `d` and `m`, 4-bit codes
q in [0, 15], w = d * q + m) and its tied embedding as Q8_0 (float16 `d`, int8 q, w = d * q). The layers
that read them are linear.py's (BlockLinear, Int4Linear).

The codes are recovered from the dequantised float32 weights: llama.cpp's Q4_1 quantiser gives every
block a 0 and a 15 code (the block's min and max), so m is the block min and d = (max - min) / 15
rounded to float16, and `is_exact_q4_1` checks that re-dequantising gives back every value. SmolLM2's
GGUF passes (all 3.3M blocks); a weight that fails was not 4-bit to begin with and stays float16.

torch's CPU int4 op (Int4Linear) computes w = (q - 8) * scale + zero per group, so scale = d and
zero = m + 8d (`int4_scale_zeros`): with float32 scales that reproduces d * q + m bit for bit (q - 8 and
8d are exact, so both sides are one rounding of the same real number). The op is vectorised for bfloat16
only, so scale and zero are held in bfloat16 too: the weights it sees differ from the file's by
bfloat16's rounding of d and m (relative 2^-9). The thresholds where each layer turns to its dense path
come from `benchmarks/engine/quant_matmul.py` and `benchmarks/engine/quant_decode.py` on this CPU.
"""

from __future__ import annotations

import torch
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
