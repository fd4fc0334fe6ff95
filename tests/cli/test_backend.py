"""`edgerun backend`: flags over settings, and what a user sees when a model cannot load."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from cli.backend import add_arguments, build_settings


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flags_override_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGERUN_ENGINE__MAX_NUM_SEQS", "7")
    monkeypatch.setenv("EDGERUN_REGION", "from-env")
    settings = build_settings(parse("--engine", "builtin", "--model", "random:smollm2", "--region", "eu-west",
                                    "--role", "decode", "--port", "9001", "--num-kv-blocks", "128", "--max-queue", "3"))
    assert settings.region == "eu-west" and settings.role == "decode" and settings.port == 9001
    assert settings.engine.model == "random:smollm2" and settings.trtllm.model == "random:smollm2"
    assert settings.engine.num_kv_blocks == 128
    assert settings.engine.max_num_seqs == 7  # not given as a flag: the environment still applies
    assert settings.max_queue == 3


def test_speculative_flags_configure_both_engines(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = build_settings(parse("--speculative", "eagle3", "--num-speculative-tokens", "5",
                                    "--speculative-model", "/heads/smollm2", "--speculative-max-concurrency", "2"))
    for section in (settings.engine, settings.trtllm):
        assert (section.speculative, section.num_speculative_tokens, section.speculative_model) == ("eagle3", 5, "/heads/smollm2")
        assert section.speculative_max_concurrency == 2
    assert settings.engine.speculative_adaptive
    assert not build_settings(parse("--speculative", "ngram", "--fixed-draft-length")).engine.speculative_adaptive
    toml = tmp_path / "backend.toml"
    toml.write_text('[engine]\nspeculative = "ngram"\nprompt_lookup_min = 1\nprompt_lookup_max = 3\n')
    monkeypatch.setenv("EDGERUN_CONFIG", str(toml))
    from_file = build_settings(parse())
    assert (from_file.engine.speculative, from_file.engine.prompt_lookup_min, from_file.engine.prompt_lookup_max) == ("ngram", 1, 3)
    with pytest.raises(ValueError, match="speculative_model"):
        build_settings(parse("--speculative", "eagle3"))


def test_mode_and_weight_format_flags_reach_the_engine() -> None:
    settings = build_settings(parse("--mode", "deterministic"))
    assert settings.engine.mode == "deterministic" and settings.engine.linear_format is None
    assert build_settings(parse("--weight-dtype", "int4")).engine.linear_format == "int4-all"
    with pytest.raises(ValueError, match="mode='deterministic'"):
        build_settings(parse("--mode", "deterministic", "--weight-dtype", "int4"))


def test_no_flags_keep_defaults() -> None:
    settings = build_settings(parse())
    assert settings.engine_kind == "builtin" and settings.port == 8100 and settings.engine.model == "smollm2"


def test_bad_flag_values_are_refused() -> None:
    with pytest.raises(SystemExit):
        parse("--role", "router")
    with pytest.raises(ValueError, match="block_size"):
        build_settings(parse("--block-size", "12"))


@pytest.mark.process
def test_a_model_that_cannot_load_exits_non_zero(tmp_path: Path) -> None:
    from cli.processes import ROOT, free_port

    missing = tmp_path / "missing.gguf"
    result = subprocess.run(
        [sys.executable, "-m", "cli", "backend", "--port", str(free_port()), "--model", str(missing)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 1
    assert "the engine failed to load" in result.stderr


def test_exposing_trtllm_serve_needs_the_explicit_opt_out(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """trtllm-serve checks no key, so even with EDGERUN_API_KEY set it may not leave loopback silently."""
    from cli.backend import run

    monkeypatch.setenv("EDGERUN_API_KEY", "a-key-trtllm-serve-would-ignore")
    assert run(parse("--engine", "trtllm", "--host", "0.0.0.0")) == 2
    assert "trtllm-serve checks no API key" in capsys.readouterr().err
    assert build_settings(parse("--allow-unauthenticated")).allow_unauthenticated is True
