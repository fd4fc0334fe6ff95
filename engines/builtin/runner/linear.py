"""Linear layers on the GGUF's own block formats through edgerun's AVX2 kernels (engines/builtin/runner/kernels).

A decode step reads every weight once, so at batch 1 its speed is the bytes read per token. These hold
SmolLM2's weights as the file stores them: the decoder's Q4_1 (per block of 32 weights: float16 d and m,
4-bit codes, w = d * q + m; 0.625 bytes per weight) and the tied head's Q8_0 (float16 d, int8 codes,
w = d * q; 1.06 bytes per weight), against float16's 2. The kernels quantise each activation row to int16
per block of 32 and do integer dot products (block_gemv.cpp): the weights are the file's, exactly; the
activations carry int16's rounding (2^-16 of the block's max |x|: below float16's rounding of weights).
With int8 activations instead, SmolLM2's max logit error against the exact model was 1.9 (over the
stated 1.5); with int16 in the decoder and int8 in the head 0.49, int16 in both 0.35 (what remains comes
from the bfloat16 prefill on an AVX-512 CPU), against 1.19 for torch's int4 path (BENCHMARKS.md).

The kernel is for short inputs (decode steps, a few rows); from `kernel_max_rows + 1` rows the layer
hands the input to `wide`, the same weight as the fast mode held it before: Int4Linear where torch's int4
op is fast (AVX-512), else Fp16Linear (fbgemm's float16 GEMM, then float32 for tall inputs), where
arithmetic rather than reading weights sets the pace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from engines.builtin.runner.quant import GROUP, Int4Linear

if TYPE_CHECKING:
    from engines.builtin.runner.weights import Fp16Linear


def pack_q4_1(codes: Tensor, d: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_1 blocks (codes [N, K] in [0, 15], d and m [N, K/32] float16) -> the kernel's layout (block_gemv.cpp):
    codes [N, 32 * ceil(K/64)] uint8, blocks in pairs of 32 bytes (block 2i in the low nibbles, 2i + 1 in the
    high ones; an odd last block alone) and scales [N, 2, K/32] float16 (each row's d, then its m)."""
    n, k = codes.shape
    blocks = codes.reshape(n, k // GROUP, GROUP).to(torch.uint8)
    if blocks.shape[1] % 2:
        blocks = torch.cat([blocks, blocks.new_zeros(n, 1, GROUP)], dim=1)
    pairs = blocks.reshape(n, -1, 2, GROUP)
    nibbles = pairs[:, :, 0] | (pairs[:, :, 1] << 4)
    return nibbles.reshape(n, -1).contiguous(), torch.stack([d, m], dim=1).half().contiguous()


@dataclass(slots=True, eq=False)
class BlockLinear:
    """An [out, in] weight in a GGUF block format ("q4_1" or "q8_0"): the kernel for up to
    `kernel_max_rows` input rows, `wide` (the same weight as Fp16Linear, or Int4Linear on AVX-512) above."""

    format: str
    codes: Tensor  # q4_1: [out, 32 * ceil(in / 64)] uint8 (pack_q4_1's layout); q8_0: [out, in] int8
    scales: Tensor  # q4_1: [out, 2, in / 32] float16 (d, then m); q8_0: [out, in / 32] float16
    wide: Fp16Linear | Int4Linear
    kernel_max_rows: int

    # up to this many rows the kernel; above, `wide`. SmolLM2 decode, one thread (benchmarks/quant_decode.py):
    # CPU per step 0.62x float16's at 1 row, 1.14x at 4
    KERNEL_MAX_ROWS = 2

    @classmethod
    def q4_1(cls, codes: Tensor, d: Tensor, m: Tensor, wide: Fp16Linear | Int4Linear) -> BlockLinear:
        """From Q4_1 blocks (`quant.q4_1_blocks`)."""
        return cls("q4_1", *pack_q4_1(codes, d, m), wide, cls.KERNEL_MAX_ROWS)

    @classmethod
    def q8_0(cls, codes: Tensor, d: Tensor, wide: Fp16Linear) -> BlockLinear:
        """From Q8_0 blocks (`quant.q8_0_blocks`)."""
        return cls("q8_0", codes.contiguous(), d.half().contiguous(), wide, cls.KERNEL_MAX_ROWS)

    def to_tensors(self) -> dict[str, Tensor]:
        """What the model cache stores: codes and scales, and the int4 op's tensors when `wide` is Int4Linear."""
        wide = self.wide.to_tensors() if isinstance(self.wide, Int4Linear) else {}
        return {"codes": self.codes, "scales": self.scales, **wide}

    def __call__(self, x: Tensor) -> Tensor:
        # x: [T, in] float32 -> [T, out] float32
        if x.shape[0] > self.kernel_max_rows:
            return self.wide(x)
        op = torch.ops.edgerun.q4_1_linear if self.format == "q4_1" else torch.ops.edgerun.q8_0_linear
        out: Tensor = op(x, self.codes, self.scales)  # torch.ops is untyped
        return out
