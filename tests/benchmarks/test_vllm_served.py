"""benchmarks/backend/vllm_served.py: vLLM gets as many KV tokens as edgerun's pool holds."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.backend.vllm_served import kv_bytes_per_token


def test_smollm2_kv_bytes_per_token_match_edgerun_block_bytes(tmp_path: Path) -> None:
    config = {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3}
    (tmp_path / "config.json").write_text(json.dumps(config))
    # engines/builtin/config.py: a block of 16 tokens holds 737,280 bytes of K and V in float32
    assert kv_bytes_per_token(tmp_path, "float32") * 16 == 737_280
    assert kv_bytes_per_token(tmp_path, "bfloat16") * 16 == 737_280 // 2
    (tmp_path / "config.json").write_text(json.dumps({**config, "head_dim": 128}))
    assert kv_bytes_per_token(tmp_path, "float32") == 2 * 30 * 3 * 128 * 4
