"""The 4-bit weight path (engines/builtin/runner/quant.py) and the fast mode's stated tolerance."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engines.builtin.config import int4_matmul_available
from engines.builtin.loader import cache
from engines.builtin.runner.kernels import cpu_has_avx2
from engines.builtin.runner.linear import BlockLinear, Fp16Linear, Int4Linear
from engines.builtin.runner.model_runner import ModelRunner
from engines.builtin.runner.quant import (
    GROUP,
    dequantize_q4_1,
    int4_scale_zeros,
    is_exact_q4_1,
    may_quantize_q4_1,
    q4_1_blocks,
)
from tests.engines.tolerance import compare, load_prompts

# The fast mode's tolerance against the exact model (BENCHMARKS.md, "Fast mode"): teacher-forced greedy
# top-1 agreement and the largest absolute logit error over every step of the prompts below.
MIN_TOP1_AGREEMENT = 0.95
MAX_LOGIT_ERROR = 1.5


def random_q4_1_weight(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, cols), dtype=torch.int32, generator=gen)
    codes[:, ::GROUP] = 0  # llama.cpp's quantiser gives every block its min (0) and max (15) code
    codes[:, 1::GROUP] = 15
    d = (torch.rand(rows, cols // GROUP, generator=gen) * 0.01 + 1e-3).half()
    m = (-torch.rand(rows, cols // GROUP, generator=gen) * 0.08).half()
    return dequantize_q4_1(codes, d, m)


def test_q4_1_blocks_round_trip_a_q4_1_weight_exactly() -> None:
    w = random_q4_1_weight(64, 128)
    assert is_exact_q4_1(w)
    assert torch.equal(dequantize_q4_1(*q4_1_blocks(w)), w)
    assert not is_exact_q4_1(torch.randn(64, 128))  # not 4-bit to begin with
    assert may_quantize_q4_1(torch.randn(64, 128), exact_only=True) is None
    assert may_quantize_q4_1(torch.randn(64, 128), exact_only=False) is not None
    assert may_quantize_q4_1(torch.randn(4, 48), exact_only=False) is None  # not whole groups


def test_the_int4_op_reproduces_q4_1_weights_exactly_with_float32_scales() -> None:
    # w = (q - 8) * d + (m + 8d) is one rounding of d * q + m: with float32 scales, bit for bit
    w = random_q4_1_weight(96, 256)
    codes, d, m = q4_1_blocks(w)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2)
    eye = torch.eye(256)
    seen = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, packed, GROUP, int4_scale_zeros(d, m, torch.float32)).t()
    assert torch.equal(seen, w)
    # the fast path's bfloat16 scales and activations: within bfloat16's rounding of the weights
    fast = torch.ops.aten._weight_int4pack_mm_for_cpu(eye.bfloat16(), packed, GROUP, int4_scale_zeros(d, m, torch.bfloat16))
    assert (fast.t().float() - w).abs().max() <= 2**-7 * w.abs().max()


@pytest.mark.parametrize("rows", [1, 3, Int4Linear.DENSE_FROM_ROWS, 40])
def test_int4_linear_matches_the_dequantised_weight_on_both_paths(rows: int) -> None:
    w = random_q4_1_weight(192, 256, seed=rows)
    x = torch.randn(rows, 256)
    out = Int4Linear.from_blocks(*q4_1_blocks(w))(x)
    exact = x @ w.t()
    assert out.dtype == torch.float32 and out.shape == (rows, 192)
    assert (out - exact).abs().max() <= 0.02 * exact.abs().max()  # bfloat16 inputs and scales


def test_derived_tensors_round_trip_through_the_cache_entry(tmp_path: Path) -> None:
    assert cache.read_derived(tmp_path, "int4") is None
    tensors = Int4Linear.from_blocks(*q4_1_blocks(random_q4_1_weight(32, 64))).to_tensors()
    cache.write_derived(tmp_path, "int4", {f"layers.0.qkv.{k}": v for k, v in tensors.items()})
    back = cache.read_derived(tmp_path, "int4")
    assert back is not None and torch.equal(back["layers.0.qkv.packed"], tensors["packed"])
    assert [p.name for p in tmp_path.iterdir()] == ["int4.safetensors"]  # no temporary file left


@pytest.mark.slow
def test_smollm2_fast_mode_runs_its_own_4_bit_weights_where_the_cpu_has_the_op(smollm2_default_runner: ModelRunner) -> None:
    layers = smollm2_default_runner.weights.layers
    # every decoder weight of the GGUF is Q4_1 and is recognised as such: with edgerun's kernels (x86 AVX2)
    # as BlockLinear, and the Q8_0 head too; else with torch's fast int4 op (AVX-512) as Int4Linear and the
    # head float16; else all float16
    linears = [getattr(layer, n) for layer in layers for n in ("qkv", "o", "gate_up", "down")]
    head = smollm2_default_runner.weights.lm_head
    if cpu_has_avx2():
        assert all(isinstance(w, BlockLinear) and w.format == "q4_1" for w in linears)
        assert isinstance(head, BlockLinear) and head.format == "q8_0"
        # above the kernel's rows torch's int4 op where it is fast (AVX-512); elsewhere the kernels take every
        # row count and no float copy of any 4-bit or 8-bit weight is held
        if int4_matmul_available():
            assert all(isinstance(w.wide, Int4Linear) for w in linears if isinstance(w, BlockLinear))
            assert isinstance(head.wide, Fp16Linear)
        else:
            assert all(w.wide is None for w in linears if isinstance(w, BlockLinear)) and head.wide is None
    else:
        assert all(isinstance(w, Int4Linear if int4_matmul_available() else Fp16Linear) for w in linears)
        assert isinstance(head, Fp16Linear)


@pytest.mark.slow
@pytest.mark.parametrize("rows", [1, 16])
def test_fast_mode_stays_within_its_stated_tolerance(smollm2_runner: ModelRunner, smollm2_default_runner: ModelRunner,
                                                     rows: int) -> None:
    prompts = (load_prompts(smollm2_runner) * 2)[:rows] if rows > 1 else load_prompts(smollm2_runner)[:2]
    result = compare(smollm2_runner, smollm2_default_runner, prompts, num_tokens=12, rows=rows)
    assert result.top1 >= MIN_TOP1_AGREEMENT, result.summary()
    assert result.max_abs_error <= MAX_LOGIT_ERROR, result.summary()


@pytest.mark.slow
@pytest.mark.parametrize("drafts", [3, 8])
def test_fast_mode_verify_rows_stay_within_its_stated_tolerance(smollm2_runner: ModelRunner,
                                                                smollm2_default_runner: ModelRunner, drafts: int) -> None:
    """Speculative verify rows (the committed token and `drafts` more, logits at each; fused in the default mode on
    x86) against the exact model's decode steps: the same tolerance as plain decoding."""
    prompts = load_prompts(smollm2_runner)[:2]
    result = compare(smollm2_runner, smollm2_default_runner, prompts, num_tokens=19, rows=1, drafts=drafts)
    assert result.num_tokens == 2 * 19
    assert result.top1 >= MIN_TOP1_AGREEMENT, result.summary()
    assert result.max_abs_error <= MAX_LOGIT_ERROR, result.summary()
