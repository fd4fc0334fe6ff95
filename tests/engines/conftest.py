"""Model runners shared by every engine test: each is built once per test session.

`smollm2_runner` is the real SmolLM2-135M-Instruct in deterministic mode (float32 weights exactly as
loaded, CPU: the reference that matches transformers), loaded through the converted-model
cache under the default cache directory, so only the first session on a machine pays for the GGUF
conversion. `tiny_runner` is a seeded random 2-layer Llama with the byte-level tokenizer.
"""

from __future__ import annotations

import pytest

from engines.builtin.config import EngineConfig
from engines.builtin.runner.model_runner import ModelRunner

NUM_KV_BLOCKS = 512  # x 16 tokens


@pytest.fixture(scope="session")
def smollm2_runner() -> ModelRunner:
    return ModelRunner(EngineConfig(model="smollm2", num_kv_blocks=NUM_KV_BLOCKS, mode="deterministic"))


@pytest.fixture(scope="session")
def smollm2_fast_runner() -> ModelRunner:
    """SmolLM2 with linear weights rounded to float16 (fbgemm), float32 activations and sums: twice
    as fast as float32 and batch-invariant up to float32 summation order, so the engine tests that
    compare batched with solo runs use it."""
    runner = ModelRunner(EngineConfig(model="smollm2", num_kv_blocks=NUM_KV_BLOCKS, weight_dtype="float16"))
    assert runner.config.linear_format == "float16"
    return runner


@pytest.fixture(scope="session")
def smollm2_default_runner() -> ModelRunner:
    """SmolLM2 as the engine runs it by default on this CPU: fast mode (the GGUF's own 4-bit weights through
    edgerun's kernels on x86 AVX2, else through torch's int4 op where it is fast, AVX-512; else float16)."""
    runner = ModelRunner(EngineConfig(model="smollm2", num_kv_blocks=NUM_KV_BLOCKS))
    assert runner.config.linear_format in ("q4_1", "int4", "float16")
    return runner


@pytest.fixture(scope="session")
def tiny_runner() -> ModelRunner:
    return ModelRunner(EngineConfig(model="random:tiny", num_kv_blocks=NUM_KV_BLOCKS, weight_dtype="float32"))
