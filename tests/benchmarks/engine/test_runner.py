"""benchmarks/engine/runner.py: decode steps of the model runner alone, measured and summarised."""

from __future__ import annotations

from benchmarks.engine.runner import measure_decode
from engines.builtin.config import EngineConfig
from engines.builtin.runner.model_runner import ModelRunner


def test_runner_bench_measures_decode() -> None:
    runner = ModelRunner(EngineConfig(model="random:tiny", num_kv_blocks=512, weight_dtype="float32"))
    result = measure_decode(runner, batch_size=3, context_len=20, num_steps=4, first_block=480)
    assert len(result.step_seconds) == 4 and result.tokens_per_s > 0
    assert "batch=3 context=20" in result.summary("tiny")
