"""The LoRA trainer (training/lora/) on the seeded random tiny Llama: the loss falls, and what it writes is a
PEFT adapter the engine's loader reads whose merged weights give the very logits training computed (so the
q/k row order, the scale and the tensor names of the export are the engine's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engines.builtin.config import EngineConfig
from engines.builtin.loader import load_model
from engines.builtin.loader.peft import load_adapter
from engines.builtin.runner.weights import LlamaWeights
from tests.engines.lora_files import merged_weights
from training.lora.export import save_adapter
from training.lora.forward import LoraParams, decoder_layers, embed_prefix
from training.lora.train import LoraTrainConfig, train_adapter

PAIRS = [["What is two plus two?", "Deux plus deux font quatre."], ["Hello!", "Bonjour !"],
         ["Name a colour.", "Le bleu est une couleur."], ["Who are you?", "Je suis un assistant."]]


def test_training_lowers_the_loss_and_writes_an_adapter_the_engine_loads(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps(PAIRS))
    config = LoraTrainConfig(num_steps=30, batch_size=2, num_top_layers=1, learning_rate=1e-2, max_answer_tokens=12)
    report = train_adapter(tmp_path / "out", "random:tiny", config, pairs)
    assert report["last_loss"] < report["first_loss"]
    peft = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert (peft["r"], peft["target_modules"]) == (8, ["q_proj", "v_proj"])
    model = load_model(EngineConfig(model="random:tiny", weight_dtype="float32")).config
    adapter = load_adapter(tmp_path / "out", model)
    assert {layer for layer, _ in adapter.weights} == {model.num_layers - 1} == set(peft["layers_to_transform"])


@pytest.mark.parametrize("targets", [("q_proj", "v_proj"), ("k_proj", "o_proj", "gate_proj", "down_proj")])
def test_exported_adapter_merged_into_the_base_gives_the_training_logits(tmp_path: Path, targets: tuple[str, ...]) -> None:
    loaded = load_model(EngineConfig(model="random:tiny", weight_dtype="float32"))
    config = loaded.config
    weights = LlamaWeights.from_state_dict({k: t.float() for k, t in loaded.weights.items()}, config)
    lora = LoraParams.init(config, 4, 8.0, targets, range(config.num_layers), seed=1)
    for _, b in lora.weights.values():  # B = 0 at init: give it something to carry
        b.data.normal_(0, 0.2)
    save_adapter(tmp_path / "a", lora, config, "random:tiny", dtype=torch.float32)
    token_ids = torch.tensor([[5, 17, 99, 3, 250, 41, 7, 8, 120, 66]])
    with torch.no_grad():
        trained = decoder_layers(weights, config, lora, embed_prefix(weights, config, token_ids, 0), range(config.num_layers))
        merged = merged_weights(weights, config, tmp_path / "a")
        reference = embed_prefix(merged, config, token_ids, config.num_layers)
    torch.testing.assert_close(trained, reference, rtol=1e-4, atol=1e-4)
    base = embed_prefix(weights, config, token_ids, config.num_layers)
    assert (trained - base).abs().max() > 1e-2, "the adapter changes the output"
