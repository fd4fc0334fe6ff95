from __future__ import annotations

from pathlib import Path

import yaml

from engines.tensorrt_llm.examples import render_examples

INFRA = Path(__file__).resolve().parents[2] / "infra" / "trtllm"


def test_checked_in_examples_match_the_renderer() -> None:
    rendered = render_examples()
    assert rendered, "the renderer produced no files"
    for relative, text in rendered.items():
        path = INFRA / relative
        assert path.exists(), f"{path} is missing: run python -m engines.tensorrt_llm.examples infra/trtllm"
        assert path.read_text() == text, f"{path} is stale: run python -m engines.tensorrt_llm.examples infra/trtllm"


def test_example_region_has_pools_and_eagle3() -> None:
    files = {relative: yaml.safe_load(text) for relative, text in render_examples().items()}
    front = files["eu-west/disaggregated.yaml"]
    assert front["context_servers"]["num_instances"] == len(front["context_servers"]["urls"]) >= 1
    assert front["generation_servers"]["num_instances"] == len(front["generation_servers"]["urls"]) >= 1
    for pool in ("eu-west/context.yaml", "eu-west/generation.yaml"):
        assert files[pool]["speculative_config"]["eagle3_one_model"] is True
        assert files[pool]["kv_cache_config"]["event_buffer_max_size"] > 0
        assert "backend" in files[pool]["cache_transceiver_config"]


def test_runbook_exists() -> None:
    assert "trtllm-serve disaggregated" in (INFRA / "RUNBOOK.md").read_text()
