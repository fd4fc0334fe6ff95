from __future__ import annotations

import pytest
import yaml

from engines.tensorrt_llm.config import (
    TrtllmConfig,
    disaggregated_options,
    eagle_decoding_type,
    llm_api_options,
    to_yaml,
)

EAGLE = {"speculative": "eagle3", "speculative_model": "/models/eagle3", "num_speculative_tokens": 4}


def render(config: TrtllmConfig, role: str = "mixed") -> dict:
    return yaml.safe_load(to_yaml(llm_api_options(config, role)))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("1.0.0", "Eagle"),
        ("1.1.0rc2", "Eagle"),
        ("1.2.0", "Eagle"),
        ("1.2.1", "Eagle"),
        ("1.3.0rc4", "Eagle3"),
        ("2.0.0", "Eagle3"),
    ],
)
def test_eagle_decoding_type_follows_the_version(version: str, expected: str) -> None:
    assert eagle_decoding_type(version) == expected
    options = render(TrtllmConfig(model="m", trtllm_version=version, **EAGLE))
    assert options["speculative_config"] == {
        "decoding_type": expected,
        "max_draft_len": 4,
        "speculative_model_dir": "/models/eagle3",
        "eagle3_one_model": True,
    }


@pytest.mark.parametrize("version", ["0.21.0", "latest", ""])
def test_unplaceable_versions_are_refused(version: str) -> None:
    with pytest.raises(ValueError, match="trtllm_version"):
        TrtllmConfig(trtllm_version=version)


def test_kv_cache_config_enables_reuse_and_events() -> None:
    options = render(TrtllmConfig(tokens_per_block=64, free_gpu_memory_fraction=0.8, event_buffer_max_size=1024))
    assert options["kv_cache_config"] == {
        "enable_block_reuse": True,
        "event_buffer_max_size": 1024,
        "tokens_per_block": 64,
        "free_gpu_memory_fraction": 0.8,
    }
    assert options["max_batch_size"] == 256 and options["max_num_tokens"] == 8192
    assert "speculative_config" not in options and "cache_transceiver_config" not in options


def test_disaggregated_workers_get_a_cache_transceiver() -> None:
    config = TrtllmConfig(cache_transceiver_backend="NIXL", max_tokens_in_buffer=4096)
    context, generation = render(config, "prefill"), render(config, "decode")
    for options in (context, generation):
        assert options["cache_transceiver_config"] == {"backend": "NIXL", "max_tokens_in_buffer": 4096}
    assert context["disable_overlap_scheduler"] is True
    assert "disable_overlap_scheduler" not in generation


def test_disaggregated_front_server_yaml() -> None:
    config = TrtllmConfig(
        context_servers=("ctx-a:8001", "ctx-b:8001"),
        generation_servers=("gen-a:8002",),
        disaggregated_host="localhost",
        disaggregated_port=9000,
    )
    assert yaml.safe_load(to_yaml(disaggregated_options(config))) == {
        "hostname": "localhost",
        "port": 9000,
        "backend": "pytorch",
        "context_servers": {"num_instances": 2, "urls": ["ctx-a:8001", "ctx-b:8001"]},
        "generation_servers": {"num_instances": 1, "urls": ["gen-a:8002"]},
    }


def test_disaggregated_needs_both_pools() -> None:
    with pytest.raises(ValueError, match="context and one generation"):
        disaggregated_options(TrtllmConfig(context_servers=("ctx:8001",)))


@pytest.mark.parametrize(
    "bad",
    [
        {"tokens_per_block": 24},
        {"free_gpu_memory_fraction": 0.0},
        {"event_buffer_max_size": 0},
        {"context_servers": ("http://ctx:8001",)},
        {"max_batch_size": 0},
    ],
)
def test_bad_settings_fail_early(bad: dict) -> None:
    with pytest.raises(ValueError):
        TrtllmConfig(**bad)


def test_eagle3_needs_a_draft_checkpoint() -> None:
    with pytest.raises(ValueError, match="speculative_model"):
        TrtllmConfig(speculative="eagle3")


def test_ngram_speculation_and_max_concurrency() -> None:
    options = render(TrtllmConfig(speculative="ngram", num_speculative_tokens=5, prompt_lookup_max=3,
                                  speculative_max_concurrency=4))
    assert options["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": 5,
        "max_matching_ngram_size": 3,
        "max_concurrency": 4,
    }


def test_model_alias_resolves_for_trtllm_serve() -> None:
    assert TrtllmConfig(model="smollm2").model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert TrtllmConfig(model="/models/llama").model_id == "/models/llama"


def test_yaml_comment_header() -> None:
    text = to_yaml({"a": 1}, "line one\n\nline three")
    assert text.splitlines()[:3] == ["# line one", "#", "# line three"]
    assert yaml.safe_load(text) == {"a": 1}


def test_guided_decoding_backend_is_written_unless_turned_off() -> None:
    assert render(TrtllmConfig())["guided_decoding_backend"] == "llguidance"
    assert render(TrtllmConfig(guided_decoding_backend="xgrammar"))["guided_decoding_backend"] == "xgrammar"
    assert "guided_decoding_backend" not in render(TrtllmConfig(guided_decoding_backend=None))
