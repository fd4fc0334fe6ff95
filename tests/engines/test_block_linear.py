"""edgerun's own Q4_1 / Q8_0 kernels (engines/builtin/runner/kernels) and the layers that use them (block_linear.py).

On an x86 CPU with AVX2 the kernels must build and load: these tests fail, not skip, when they do not (the
Makefile's install step builds them). Only a CPU without AVX2 skips them, saying so.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from engines.builtin.runner import kernels
from engines.builtin.runner.linear import BlockLinear, Fp16Linear, Int4Linear, pack_q4_1, pack_q8_0
from engines.builtin.runner.quant import GROUP, dequantize_q8_0, may_quantize_q8_0, q4_1_blocks, q8_0_blocks
from tests.engines.test_quant import random_q4_1_weight

needs_avx2 = pytest.mark.skipif(not kernels.cpu_has_avx2(), reason="edgerun's kernels need x86 AVX2, FMA and F16C; this CPU lacks them")


@pytest.fixture(scope="module", autouse=True)
def loaded_kernels() -> None:
    if kernels.cpu_has_avx2() and os.environ.get(kernels.DISABLE_ENV, "") != "off":
        assert kernels.load(), "the CPU has AVX2 but edgerun's kernels did not build or load (see the log)"


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def num_threads(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def integer_activations(x: torch.Tensor, levels: int) -> torch.Tensor:
    """x as the kernel sees it, in float64: per block of 32, s * round(x / s) with s = max |x| / levels
    (32767: both kernels use int16 activations)."""
    t, k = x.shape
    blocks = x.double().reshape(t, k // GROUP, GROUP)
    amax = blocks.abs().amax(-1, keepdim=True).float()
    inv = torch.where(amax > 0, levels / amax, 0.0)
    codes = (blocks.float() * inv).round()  # float32 like the kernel's x * (levels / amax)
    return (codes.double() * (amax / levels).double()).reshape(t, k)


def magnitude(x: torch.Tensor, w: torch.Tensor) -> float:
    """The largest sum of |x_k w_k| of any output: float32 rounding errors scale with it."""
    return float((x.double().abs() @ w.double().abs().t()).max())


def q4_1_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # sum_j (d q_j + m) x_j = d * sum_j q_j x_j + m * sum_j x_j: int16 x in the first term, exact x in the second
    codes, d, m = q4_1_blocks(w)
    n, k = w.shape
    xq, xe = integer_activations(x, 32767), x.double()
    dq = (d.double()[..., None] * codes.reshape(n, k // GROUP, GROUP).double()).reshape(n, k)
    mm = m.double().repeat_interleave(GROUP, dim=1)
    return xq @ dq.t() + xe @ mm.t()


# row counts: each tile height (1-4 rows) and several tiles with a ragged last one, up to many-stream decode steps
# and prefill chunks; out_features: whole pairs of 8-column groups, a lone last group and a ragged one (37, 70)
ROWS = [1, 2, 3, 4, 7, 16, 33, 64, 130]
SHAPES = [(96, 576), (37, 1536), (70, 96), (8, 32)]  # in_features 96 and 32: an odd number of blocks


@needs_avx2
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_q4_1_kernel_matches_a_float64_reference(rows: int, n: int, k: int, num_threads: int) -> None:
    w = random_q4_1_weight(n, k, seed=rows + n)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(k))
    x[0, :GROUP] = 0  # an all-zero block (scale 0)
    y = torch.ops.edgerun.q4_1_linear(x, *pack_q4_1(*q4_1_blocks(w)))
    assert y.dtype == torch.float32 and y.shape == (rows, n)
    expected = q4_1_reference(x, w)  # the kernel's own arithmetic, up to float32 rounding and summation order
    assert (y.double() - expected).abs().max() <= 1e-5 * magnitude(x, w)
    exact = x.double() @ w.double().t()  # and int16 activations' rounding is tiny
    assert (y.double() - exact).abs().max() <= 1e-4 * exact.abs().max()


@needs_avx2
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_q8_0_kernel_matches_a_float64_reference(rows: int, n: int, k: int, num_threads: int) -> None:
    gen = torch.Generator().manual_seed(rows + n)
    codes = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    codes[:, 0] = -128  # |q| = 128 still multiplies right
    d = (torch.rand(n, k // GROUP, generator=gen) * 0.01 + 1e-4).half()
    x = torch.randn(rows, k, generator=gen)
    y = torch.ops.edgerun.q8_0_linear(x, *pack_q8_0(codes, d))
    assert y.shape == (rows, n)
    w = dequantize_q8_0(codes, d).double()
    expected = integer_activations(x, 32767) @ w.t()
    assert (y.double() - expected).abs().max() <= 1e-5 * magnitude(x, w)
    exact = x.double() @ w.t()
    assert (y.double() - exact).abs().max() <= 1e-4 * exact.abs().max()


def test_q8_0_blocks_reproduce_a_q8_0_weight_exactly() -> None:
    codes, d = q8_0_blocks(torch.randn(16, 128))
    w = dequantize_q8_0(codes, d)
    back = may_quantize_q8_0(w)
    assert back is not None and torch.equal(back[0], codes) and torch.equal(back[1], d)
    assert may_quantize_q8_0(torch.randn(16, 128)) is None  # not 8-bit to begin with
    assert may_quantize_q8_0(torch.randn(4, 48)) is None  # not whole blocks


def test_pack_q4_1_puts_each_code_in_its_columns_group_lane_and_nibble() -> None:
    n, k = 11, 3 * GROUP  # a ragged second group of columns, an odd number of blocks
    codes = torch.randint(0, 16, (n, k), generator=torch.Generator().manual_seed(0)).int()
    d, m = torch.rand(n, 3).half(), -torch.rand(n, 3).half()
    packed, scales = pack_q4_1(codes, d, m)
    assert packed.shape == (2, 3 * 128) and packed.dtype == torch.uint8 and scales.shape == (3, 2 * n)
    lanes = packed.reshape(2, 3, 4, 16, 2).int()  # [group, block, quad u, lane, byte]
    lanes = lanes[..., 0] | (lanes[..., 1] << 8)
    for col, kk in ((0, 0), (3, 37), (10, 95), (7, 64)):
        g, c, b, j = col // 8, col % 8, kk // GROUP, kk % GROUP
        u, s, e = j // 8, (j % 8) // 2, j % 2
        assert (lanes[g, b, u, 2 * c + e] >> (4 * s)) & 15 == codes[col, kk]
    assert torch.equal(lanes[1, :, :, 6:], torch.zeros(3, 4, 10, dtype=torch.int32))  # padding columns 11-15: zero codes
    assert torch.equal(scales[:, :n], d.T) and torch.equal(scales[:, n:], m.T)


@needs_avx2
def test_layers_run_the_kernel_at_every_row_count_without_a_wide_path() -> None:
    w = random_q4_1_weight(64, 128)
    head_codes, head_d = q8_0_blocks(torch.randn(64, 128))
    head_w = dequantize_q8_0(head_codes, head_d)
    for linear, weight in ((BlockLinear.q4_1(*q4_1_blocks(w)), w), (BlockLinear.q8_0(head_codes, head_d), head_w)):
        assert linear.wide is None  # 4-bit / 8-bit only: no float copy of the weight
        for rows in (1, 5, 64, 200):
            x = torch.randn(rows, 128)
            assert (linear(x) - x @ weight.t()).abs().max() <= 1e-4 * (x @ weight.t()).abs().max()


@needs_avx2
def test_layers_beside_an_int4_op_hand_it_the_rows_above_the_kernels() -> None:
    w = random_q4_1_weight(64, 128)
    head_codes, head_d = q8_0_blocks(torch.randn(64, 128))
    q4 = q4_1_blocks(w)
    layer = BlockLinear.q4_1(*q4, Int4Linear.from_blocks(*q4))
    head = BlockLinear.q8_0(head_codes, head_d, Fp16Linear.from_weight(dequantize_q8_0(head_codes, head_d)))
    for linear in (layer, head):
        assert linear.wide is not None and linear.kernel_max_rows == BlockLinear.INT4_FROM_ROWS - 1
        short = torch.randn(linear.kernel_max_rows, 128)
        wide = torch.randn(linear.kernel_max_rows + 1, 128)
        assert not torch.equal(linear(short), linear.wide(short))
        assert torch.equal(linear(wide), linear.wide(wide))


@pytest.mark.process
def test_the_engine_falls_back_to_torch_ops_when_the_kernels_are_off() -> None:
    code = ("import logging; logging.basicConfig(level=logging.INFO, format='%(message)s')\n"
            "from engines.builtin.runner import kernels\nfrom engines.builtin.config import EngineConfig\n"
            "print(kernels.load(), EngineConfig().linear_format)")
    env = {**os.environ, kernels.DISABLE_ENV: "off"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() in (["False", "int4"], ["False", "float16"])
    assert "edgerun kernels off" in done.stderr  # one clear log line


def test_asking_for_q4_1_without_the_kernels_says_how_to_fix_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.builtin.config import EngineConfig
    from engines.builtin.runner.model_runner import ModelRunner

    monkeypatch.setattr(kernels, "load", lambda: False)
    with pytest.raises(RuntimeError, match="weight_dtype='auto'"):
        ModelRunner(EngineConfig(model="random:tiny", num_kv_blocks=8, weight_dtype="q4_1"))


@needs_avx2
def test_q4_1_packing_round_trips_through_the_cache_tensors() -> None:
    from engines.builtin.runner.weights import LayerWeights, LlamaWeights

    def weights() -> LlamaWeights:
        layer = LayerWeights(torch.ones(64), random_q4_1_weight(96, 64, seed=1), random_q4_1_weight(64, 64, seed=2),
                             torch.ones(64), torch.randn(128, 64, generator=torch.Generator().manual_seed(3)),  # not Q4_1
                             random_q4_1_weight(64, 64, seed=4))
        head = dequantize_q8_0(*q8_0_blocks(torch.randn(200, 64, generator=torch.Generator().manual_seed(5))))
        return LlamaWeights(embed=head, layers=[layer], norm=torch.ones(64), lm_head=head)

    first = weights()
    stored = first.pack("q4_1")
    assert {"lm_head.codes", "layers.0.qkv.codes", "layers.0.down.scales"} <= stored.keys()
    assert not any(key.startswith("layers.0.gate_up.") for key in stored)  # float16: nothing to store
    again = weights()
    assert again.pack("q4_1", stored).keys() == stored.keys()
    x = torch.randn(1, 64)
    for name in ("qkv", "o", "gate_up", "down"):
        a, b = getattr(first.layers[0], name), getattr(again.layers[0], name)
        assert type(a) is type(b) and torch.equal(a(x), b(x))
    assert isinstance(again.lm_head, BlockLinear) and torch.equal(again.lm_head(x), first.lm_head(x))
