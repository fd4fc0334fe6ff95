"""One decode step's matmuls per weight format and batch size: where each path wins, on this CPU.

Builds SmolLM2-135M's linear weights (30 layers of qkv, o, gate_up, down, plus the 49,152-row
lm_head) with random Q4_1 values, once per format, and times one pass over every layer's matmuls for
an input of T rows. The pass touches all 30 layers' distinct weights, as a real step does, so at
small T it measures streaming the weights from memory, not a layer sitting in the L3 cache.

Formats: float32 (F.linear), float16 (fbgemm, the engine's previous default), bf16 (dense bfloat16
GEMM), int4 (torch's packed 4-bit op, bfloat16 activations), int8 (per-row int8, bfloat16
activations), q4_1 (edgerun's kernel, int16 activations: the engine's decoder weights below
`kernel_max_rows`). Rounds interleave the formats, so all see the same machine; the report is the median
over rounds of each (format, T), in ms per pass, and each format's time relative to float16.
`--clock cpu` times the calling thread's CPU instead of the wall (with --threads 1: steadier on a busy machine).

    python -m benchmarks.engine.quant_matmul --rows 1 2 4 8 16 32 64 128 --rounds 5 --threads 2
    ATEN_CPU_CAPABILITY=avx2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2 python -m benchmarks.engine.quant_matmul \
        --formats float16 q4_1 --rows 1 2 4 8 16 32 64 --rounds 3 --threads 1 --clock cpu   # as an AVX2-only CPU
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.common import machine
from engines.builtin.runner import kernels
from engines.builtin.runner.linear import BlockLinear, Fp16Linear
from engines.builtin.runner.quant import GROUP, dequantize_q4_1, int4_scale_zeros

D, FFN, QKV, V, LAYERS = 576, 1536, 960, 49152, 30
LAYER_SHAPES = [(QKV, D), (D, D), (2 * FFN, D), (D, FFN)]  # qkv, o, gate_up, down: [out, in]


def random_q4_1(n: int, k: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen)
    d = (torch.rand(n, k // GROUP, generator=gen) * 0.004 + 0.001).half()
    m = -(d.float() * 8).half()
    return codes, d, m


Matmul = Callable[[Tensor], Tensor]  # x [T, in] float32 -> [T, out]


def build(fmt: str, codes: Tensor, d: Tensor, m: Tensor) -> Matmul:
    w = dequantize_q4_1(codes, d, m)
    if fmt == "float32":
        return lambda x: F.linear(x, w)
    if fmt == "float16":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            packed, bias = torch.fbgemm_pack_gemm_matrix_fp16(w), torch.zeros(w.shape[0])
        return lambda x: torch.fbgemm_linear_fp16_weight(x, packed, bias)
    if fmt == "bf16":
        wb = w.to(torch.bfloat16)
        return lambda x: F.linear(x.to(torch.bfloat16), wb)
    if fmt == "int4":
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2)
        sz = int4_scale_zeros(d, m, torch.bfloat16)
        return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, GROUP, sz)
    if fmt == "q4_1":
        linear = BlockLinear.q4_1(codes, d, m, Fp16Linear.from_weight(w))
        return lambda x: torch.ops.edgerun.q4_1_linear(x, linear.codes, linear.scales)
    if fmt == "int8":
        scales = w.abs().amax(1) / 127
        q = (w / scales[:, None]).round().to(torch.int8)
        sb = scales.to(torch.bfloat16)
        return lambda x: torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), q, sb)
    raise ValueError(fmt)


def build_model(fmt: str, seed: int) -> tuple[list[Matmul], Matmul]:
    gen = torch.Generator().manual_seed(seed)
    layers = [build(fmt, *random_q4_1(n, k, gen)) for _ in range(LAYERS) for n, k in LAYER_SHAPES]
    return layers, build(fmt, *random_q4_1(V, D, gen))


def time_pass(matmuls: list[Matmul], in_features: list[int], rows: int, repeats: int,
              clock: Callable[[], float] = time.perf_counter) -> float:
    inputs = {k: torch.randn(rows, k) for k in set(in_features)}
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        for k, mm in zip(in_features, matmuls):
            mm(inputs[k])
        best = min(best, clock() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", nargs="+", default=["float32", "float16", "bf16", "int4", "int8"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64, 128])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3, help="passes per measurement (the fastest is kept)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="cpu: this thread's CPU time")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if "q4_1" in args.formats and not kernels.load():
        raise SystemExit("the q4_1 format needs edgerun's kernels (python -m engines.builtin.runner.kernels)")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    models = {fmt: build_model(fmt, seed=0) for fmt in args.formats}
    layer_inputs = [k for _ in range(LAYERS) for _, k in LAYER_SHAPES]
    layer_ms: dict[tuple[str, int], list[float]] = {}
    head_ms: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.rounds):
        for rows in args.rows:
            for fmt, (layers, head) in models.items():
                layer_ms.setdefault((fmt, rows), []).append(time_pass(layers, layer_inputs, rows, args.repeats, clock))
                head_ms.setdefault((fmt, rows), []).append(time_pass([head], [D], rows, args.repeats, clock))
    print(f"# {machine(with_torch=True)}, torch CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"threads={torch.get_num_threads()}, clock {args.clock}, load average {os.getloadavg()}")
    print("# median ms per pass: 30 layers' linears | lm_head   (x: relative to float16)")
    for rows in args.rows:
        base = statistics.median(layer_ms[("float16", rows)]) if "float16" in models else None
        cells = []
        for fmt in models:
            ms, head = statistics.median(layer_ms[(fmt, rows)]), statistics.median(head_ms[(fmt, rows)])
            ratio = f" ({ms / base:.2f}x)" if base else ""
            cells.append(f"{fmt} {ms:6.2f}{ratio} | {head:5.2f}")
        print(f"T={rows:4d}  " + "   ".join(cells))


if __name__ == "__main__":
    main()
