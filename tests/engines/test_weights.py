"""Linear weight formats: a float16 weight packed in row chunks computes what one packed weight does."""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from engines.builtin.runner.linear import Fp16Linear

pytestmark = pytest.mark.skipif("fbgemm" not in torch.backends.quantized.supported_engines, reason="needs fbgemm")


@pytest.mark.parametrize("pooled", [False, True])
def test_fp16_weight_packed_in_row_chunks_gives_the_same_outputs(monkeypatch: pytest.MonkeyPatch, pooled: bool) -> None:
    monkeypatch.setattr(Fp16Linear, "PACK_ROWS", 64)
    torch.manual_seed(0)
    weight, x = torch.randn(200, 48), torch.randn(5, 48)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        whole = torch.fbgemm_pack_gemm_matrix_fp16(weight.half().float())
        expected = torch.fbgemm_linear_fp16_weight(x, whole, torch.zeros(200))
    with ThreadPoolExecutor(2) as pool:
        linear = Fp16Linear.from_weight(weight, pool if pooled else None)
    assert len(linear.packed) == 4  # 64 + 64 + 64 + 8 rows
    assert torch.equal(linear(x), expected)
    tall = torch.randn(Fp16Linear.DENSE_FROM_ROWS, 48)  # the float32 copy of the same rounded values
    torch.testing.assert_close(linear(tall), tall @ weight.half().float().t(), atol=1e-4, rtol=1e-4)
