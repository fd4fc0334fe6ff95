"""benchmarks/engine/lora_batch.py runs end to end on the tiny random Llama and prints its table."""

from __future__ import annotations

import pytest

from benchmarks.engine.lora_batch import main


def test_lora_batch_bench_prints_a_row_per_adapter_count(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--streams", "4", "--adapters", "0,2", "--max-tokens", "4", "--rounds", "1", "--threads", "1",
            "--set", "model=random:tiny", "--set", "weight_dtype=float32", "--set", "num_kv_blocks=128"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| 0 |" in out and "| 2 |" in out and "adapter load from disk" in out
