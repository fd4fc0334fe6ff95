"""The linear layers' weight kinds, each a callable x [T, in] float32 -> [T, out] float32.

    Tensor        a plain weight: `F.linear` (the exact model; CUDA)
    Fp16Linear    float16 weights through fbgemm's float16 GEMM (the "float16" format)
    Int4Linear    Q4_1 weights through torch's CPU int4 op, bfloat16 activations ("int4", AVX-512)
    BlockLinear   the GGUF's own Q4_1 / Q8_0 blocks through edgerun's AVX2 kernels ("q4_1"), any row count

Decoding reads every weight once per token, so at batch 1 a step's speed is the bytes it reads; Fp16Linear
and Int4Linear hold a packed form for short inputs (decode steps) and hand tall ones (prefill, many streams),
where arithmetic rather than reading weights sets the pace, to a dense copy; BlockLinear's kernels need none. Which kind
each weight takes is `LlamaWeights.pack`'s choice (weights.py); the block formats' maths is quant.py's.

BlockLinear holds SmolLM2's weights as the file stores them: the decoder's Q4_1 (per block of 32 weights:
float16 d and m, 4-bit codes, w = d * q + m; 0.625 bytes per weight) and the tied head's Q8_0 (float16 d,
int8 codes, w = d * q; 1.06 bytes per weight), against float16's 2, repacked at load time into the kernels'
layout (output columns in groups of 8: pack_q4_1, pack_q8_0). The kernels quantise each activation row to
int16 per block of 32 and do integer dot products (kernels/block_gemv.cpp): the weights are the file's,
exactly; the activations carry int16's rounding (2^-16 of the block's max |x|: below float16's rounding of
weights). With int8 activations instead, SmolLM2's max logit error against the exact model was 1.9 (over the
stated 1.5); with int16 in the decoder and int8 in the head 0.49, int16 in both 0.35 (what remains comes from
the bfloat16 prefill on an AVX-512 CPU), against 1.19 for torch's int4 path (BENCHMARKS.md). On an AVX2-only
CPU the kernels take every row count (decode steps, verify rows, prefill chunks: idle, 0.62x float16 GEMM's CPU at
1 row, 1.02x at 16, 1.12x at 64; 0.9-0.97x float32 BLAS at 128-512; BENCHMARKS.md "4-bit kernels on AVX2"), so no float copy of those
weights is kept; where torch's int4 op is fast (AVX-512) the rows above `kernel_max_rows` go to `wide`, an
Int4Linear (Fp16Linear for the head), as before.

Int4Linear runs Q4_1 through torch's CPU int4 weight-only matmul (`_weight_int4pack_mm_for_cpu`, group
size 32), vectorised for bfloat16 activations only (float32 runs a scalar loop ~30x slower), so its
scales and inputs are bfloat16: that is why it is the fast mode, not the exact one (quant.py has the
conversion, BENCHMARKS.md the error).
"""

from __future__ import annotations

import warnings
from concurrent.futures import Executor
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from engines.builtin.runner.quant import GROUP, dequantize_q4_1, int4_scale_zeros


@dataclass(slots=True, eq=False)
class Fp16Linear:
    """A [out, in] weight rounded to float16, for CPU matmuls with float32 activations.

    Decoding reads every weight once per token, so on a CPU it runs at memory bandwidth (SmolLM2-135M:
    540 MB of float32 per token). fbgemm's float16 GEMM keeps the weight packed as float16 and widens
    it to float32 in registers, so a decode step reads half the bytes while activations and sums stay
    float32: the only change from the float32 model is the weights' rounding (relative 2^-11).

    fbgemm's kernel is slower than float32 BLAS on tall inputs (a prefill chunk: ~1.7x at 512 rows),
    where the arithmetic, not the weight reads, sets the pace. Those run through a float32 copy of
    the same rounded values, so both paths compute with one set of weights and differ only in the
    order of float32 sums. The copy costs memory (1.5x the float32 model in all): speed first here.

    It calls the ATen fbgemm ops (a few microseconds per call) rather than torch.ops.quantized's
    (~25 us: boxed custom-class dispatch). torch marks them deprecated; torch is pinned in pyproject.
    """

    packed: tuple[Tensor, ...]  # opaque fbgemm handles: the float16 weight, PACK_ROWS output rows each
    dense: Tensor  # [out, in] float32, the same float16 values
    biases: tuple[Tensor, ...]  # [rows of each handle] zeros: the fbgemm op takes one

    DENSE_FROM_ROWS = 96  # inputs with at least this many rows use the float32 copy
    # Packing is slow scalar work (SmolLM2's [49152, 576] head: 0.5 s on one core, most of the packing
    # at start-up), so a big weight is packed in row chunks on several threads; each output column
    # is still one dot product over the whole input, so the results are the same.
    PACK_ROWS = 12288

    @classmethod
    def from_weight(cls, weight: Tensor, pool: Executor | None = None) -> Fp16Linear:
        """Round and pack `weight` [out, in]; its row chunks are packed on `pool` when one is given."""
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise RuntimeError("weight_dtype='float16' needs a torch build with fbgemm (x86 CPU)")
        dense = weight.to(torch.float16).float()
        chunks = torch.split(dense, cls.PACK_ROWS)
        with warnings.catch_warnings():  # the deprecation notice, once per process
            warnings.simplefilter("ignore", UserWarning)
            packed = tuple((pool.map if pool is not None else map)(torch.fbgemm_pack_gemm_matrix_fp16, chunks))
            out = cls(packed, dense, tuple(torch.zeros(chunk.shape[0]) for chunk in chunks))
            out(torch.zeros(1, weight.shape[1]))
        return out

    def __call__(self, x: Tensor) -> Tensor:
        # x: [T, in] float32 -> [T, out] float32
        if x.shape[0] >= self.DENSE_FROM_ROWS:
            return F.linear(x, self.dense)
        x = x.contiguous()
        outs = [torch.fbgemm_linear_fp16_weight(x, packed, bias) for packed, bias in zip(self.packed, self.biases)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)


@dataclass(slots=True, eq=False)
class Int4Linear:
    """A Q4_1 [out, in] weight: packed 4-bit codes for short inputs, a dense bfloat16 copy for tall ones."""

    packed: Tensor  # [out, in / 2] uint8, the op's own layout
    scale_zeros: Tensor  # [in / 32, out, 2] bfloat16
    dense: Tensor  # [out, in] bfloat16, the dequantised weight
    dense_from_rows: int

    # from this many rows a dense bfloat16 GEMM; below, the packed op. At 16 decode rows the packed op
    # measured 1.04x float16's step time and dense bfloat16 1.18x (benchmarks/engine/quant_decode.py), at 64
    # rows dense bfloat16 0.73x (benchmarks/engine/quant_matmul.py)
    DENSE_FROM_ROWS = 64

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


KERNEL_GROUP = 8  # the kernels' output columns per vector (kernels/block_gemv.cpp)


def _column_groups(codes: Tensor) -> Tensor:
    """codes [N, K] -> [G, 8, K/32, 32], N padded with zero codes to G * 8 columns."""
    n, k = codes.shape
    pad = -n % KERNEL_GROUP
    if pad:
        codes = torch.cat([codes, codes.new_zeros(pad, k)])
    return codes.reshape(-1, KERNEL_GROUP, k // GROUP, GROUP)


def pack_q4_1(codes: Tensor, d: Tensor, m: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_1 blocks (codes [N, K] in [0, 15], d and m [N, K/32] float16) -> the kernel's layout (block_gemv.cpp):
    codes [ceil(N/8), K/32 * 128] uint8, per group of 8 columns and block four quads of 16 uint16 lanes, quad u's
    lane 2c + e holding in nibble s the code of column c at k = 8u + 2s + e; scales [K/32, 2 * N] float16 (each
    block's d of every column, then its m)."""
    g = _column_groups(codes.to(torch.int32))  # [G, c, b, 32]; 32 = (u, s, e)
    g = g.reshape(*g.shape[:3], 4, 4, 2).permute(0, 2, 3, 1, 5, 4)  # [G, b, u, c, e, s]
    lanes = (g << torch.tensor([0, 4, 8, 12], dtype=torch.int32)).sum(-1)  # [G, b, u, c, e] uint16 values
    packed = torch.stack([lanes & 0xFF, lanes >> 8], dim=-1).to(torch.uint8)  # little-endian bytes
    scales = torch.stack([d.half().T, m.half().T], dim=1)  # [K/32, 2, N]
    return packed.reshape(g.shape[0], -1).contiguous(), scales.reshape(scales.shape[0], -1).contiguous()


def pack_q8_0(codes: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
    """Q8_0 blocks (codes [N, K] int8, d [N, K/32] float16) -> the kernel's layout (block_gemv.cpp): codes
    [ceil(N/8), K/32 * 256] int8, per group of 8 columns, block and k pair j 16 bytes (byte 2c + e: column c,
    k = 2j + e); scales [K/32, N] float16."""
    g = _column_groups(codes.to(torch.int8))  # [G, c, b, 32]; 32 = (j, e)
    g = g.reshape(*g.shape[:3], GROUP // 2, 2).permute(0, 2, 3, 1, 4)  # [G, b, j, c, e]
    return g.reshape(g.shape[0], -1).contiguous(), d.half().T.contiguous()


@dataclass(slots=True, eq=False)
class BlockLinear:
    """An [out, in] weight in a GGUF block format ("q4_1" or "q8_0"): the kernel for up to `kernel_max_rows`
    input rows, `wide` above (torch's int4 op on AVX-512); with no `wide`, the kernel at every row count."""

    format: str
    codes: Tensor  # q4_1: [ceil(out / 8), in / 32 * 128] uint8 (pack_q4_1's layout); q8_0: [ceil(out / 8), in / 32 * 256] int8
    scales: Tensor  # q4_1: [in / 32, 2 * out] float16 (d, then m); q8_0: [in / 32, out] float16
    wide: Fp16Linear | Int4Linear | None
    kernel_max_rows: int

    # Which path takes a step of T rows, in one place. Without torch's int4 op (AVX2-only CPUs) the kernel runs
    # every T: SmolLM2's linears, one thread, CPU per pass against float16 GEMM (benchmarks/engine/quant_matmul.py,
    # BENCHMARKS.md "4-bit kernels on AVX2"), idle: 0.62x at 1 row, 0.72x at 4, 1.02x at 16, 1.12x at 64 (the Q8_0
    # head 0.77x there): near parity for tall steps at a third of the memory, so no float copy is kept.
    # Beside the int4 op (AVX-512) the kernel takes up to INT4_FROM_ROWS - 1 rows, the op the rest.
    INT4_FROM_ROWS = 3

    @classmethod
    def max_rows(cls, wide: Fp16Linear | Int4Linear | None) -> int:
        return cls.INT4_FROM_ROWS - 1 if wide is not None else 1 << 62

    @classmethod
    def q4_1(cls, codes: Tensor, d: Tensor, m: Tensor, wide: Fp16Linear | Int4Linear | None = None) -> BlockLinear:
        """From Q4_1 blocks (`quant.q4_1_blocks`)."""
        return cls("q4_1", *pack_q4_1(codes, d, m), wide, cls.max_rows(wide))

    @classmethod
    def q8_0(cls, codes: Tensor, d: Tensor, wide: Fp16Linear | None = None) -> BlockLinear:
        """From Q8_0 blocks (`quant.q8_0_blocks`)."""
        return cls("q8_0", *pack_q8_0(codes, d), wide, cls.max_rows(wide))

    @classmethod
    def from_tensors(cls, format: str, tensors: dict[str, Tensor], wide: Fp16Linear | Int4Linear | None) -> BlockLinear:
        """From `to_tensors()`'s output (saved in the model cache)."""
        return cls(format, tensors["codes"], tensors["scales"], wide, cls.max_rows(wide))

    def to_tensors(self) -> dict[str, Tensor]:
        """What the model cache stores: codes and scales, and the int4 op's tensors when `wide` is Int4Linear."""
        wide = self.wide.to_tensors() if isinstance(self.wide, Int4Linear) else {}
        return {"codes": self.codes, "scales": self.scales, **wide}

    def __call__(self, x: Tensor) -> Tensor:
        # x: [T, in] float32 -> [T, out] float32
        if self.wide is not None and x.shape[0] > self.kernel_max_rows:
            return self.wide(x)
        op = torch.ops.edgerun.q4_1_linear if self.format == "q4_1" else torch.ops.edgerun.q8_0_linear
        out: Tensor = op(x, self.codes, self.scales)  # torch.ops is untyped
        return out


Linear = Tensor | Fp16Linear | Int4Linear | BlockLinear
