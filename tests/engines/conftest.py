"""Model runners shared by every engine test: each is built once per test session.

`smollm2_runner` is the real SmolLM2-135M-Instruct (float32, CPU), loaded through the converted-model
cache under the default cache directory, so only the first session on a machine pays for the GGUF
conversion. `tiny_runner` is a seeded random 2-layer Llama with the byte-level tokenizer.
"""

from __future__ import annotations

import pytest

from engines.builtin.config import EngineConfig
from engines.builtin.model_runner import ModelRunner

NUM_KV_BLOCKS = 512  # x 16 tokens


@pytest.fixture(scope="session")
def smollm2_runner() -> ModelRunner:
    return ModelRunner(EngineConfig(model="smollm2", num_kv_blocks=NUM_KV_BLOCKS))


@pytest.fixture(scope="session")
def tiny_runner() -> ModelRunner:
    return ModelRunner(EngineConfig(model="random:tiny", num_kv_blocks=NUM_KV_BLOCKS))
