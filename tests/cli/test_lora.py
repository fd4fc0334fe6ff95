"""`edgerun lora train` end to end on the seeded random tiny Llama: flags in, a PEFT adapter directory out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main


def test_lora_train_writes_a_peft_adapter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps([["Hello!", "Bonjour !"], ["Who are you?", "Je suis un assistant."]]))
    out = tmp_path / "adapter"
    assert main(["lora", "train", "--out", str(out), "--model", "random:tiny", "--pairs", str(pairs), "--steps", "2",
                 "--rank", "4", "--targets", "q_proj,o_proj", "--top-layers", "1"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["num_steps"] == 2 and report["num_pairs"] == 2
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, ["o_proj", "q_proj"])
    assert (out / "adapter_model.safetensors").is_file()
