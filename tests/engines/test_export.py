"""`edgerun export-hf`: a built-in engine model written as a Hugging Face checkpoint (loader/export.py).

That vLLM serves the exported SmolLM2 as our engine runs it is checked end to end in
tests/vllm/test_gateway_vllm.py; here: the checkpoint holds the same model, transformers reads its
tokenizer as ours, and an export is done once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cli.processes import ROOT
from engines.builtin.config import EngineConfig
from engines.builtin.loader import load_model
from engines.builtin.loader.export import default_export_dir, export_hf

TEXTS = ["Hello world, how are you?", "<|im_start|>user\nhi<|im_end|>\n", "  spaces\n\tand tabs 123 ünïcode 🙂"]


def test_an_exported_checkpoint_loads_back_as_the_same_model(tmp_path: Path) -> None:
    config = EngineConfig(model="random:tiny", cache_dir=tmp_path / "cache")
    directory = export_hf(config, tmp_path / "tiny-hf")
    original, exported = load_model(config), load_model(EngineConfig(model=str(directory)))
    assert exported.config == original.config
    assert exported.weights.keys() == original.weights.keys()
    for name, tensor in original.weights.items():
        torch.testing.assert_close(exported.weights[name], tensor, rtol=0, atol=0, msg=name)
    assert exported.tokenizer.encode(TEXTS[2]) == original.tokenizer.encode(TEXTS[2])
    assert exported.tokenizer.chat_template == original.tokenizer.chat_template


def test_an_export_is_written_once(tmp_path: Path) -> None:
    config = EngineConfig(model="random:tiny", cache_dir=tmp_path)
    directory = export_hf(config)
    assert directory == default_export_dir(config) == tmp_path / "hf" / "random-tiny"
    written = (directory / "model.safetensors").stat().st_mtime_ns
    assert export_hf(config) == directory
    assert (directory / "model.safetensors").stat().st_mtime_ns == written
    assert [p.name for p in tmp_path.joinpath("hf").iterdir()] == ["random-tiny"]  # no temporary left behind


@pytest.mark.slow
def test_transformers_reads_the_exported_smollm2_tokenizer_and_config_as_ours() -> None:
    transformers = pytest.importorskip("transformers")
    config = EngineConfig(model="smollm2")
    directory = export_hf(config)  # the one `make` exports for vLLM: ~/.cache/edgerun/hf
    ours = load_model(config)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    for text in TEXTS:
        assert theirs(text)["input_ids"] == ours.tokenizer.encode(text), text
    messages = [{"role": "user", "content": "What is 2+2?"}]
    assert theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        ours.tokenizer.apply_chat_template(messages)
    )
    hf_config = transformers.AutoConfig.from_pretrained(directory)
    assert (hf_config.num_hidden_layers, hf_config.num_key_value_heads, hf_config.tie_word_embeddings) == (30, 3, True)
    assert json.loads((directory / "tokenizer_config.json").read_text())["model_max_length"] == 8192


@pytest.mark.process
def test_the_cli_prints_the_directory_or_says_what_is_wrong(tmp_path: Path) -> None:
    def export(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "cli", "export-hf", "--cache-dir", str(tmp_path), *args]
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)

    done = export("--model", "random:tiny")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "hf" / "random-tiny")
    failed = export("--model", str(tmp_path / "missing.gguf"))
    assert failed.returncode == 2
    assert "not 'smollm2', 'random:<preset>', a .gguf file" in failed.stdout
