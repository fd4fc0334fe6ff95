import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from engines.builtin.speculative.eagle3 import HeadFormatError, load_proposer
from engines.builtin.speculative.eagle3.checkpoint import WEIGHTS_FILE, load_head
from engines.builtin.speculative.proposer import DraftInput
from tests.engines.eagle3.conftest import DRAFT_VOCAB, HIDDEN, TINY_TARGET, VOCAB
from training.eagle3.export import save_head

PUBLISHED_NAMES = {
    "fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
    "midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight", "midlayer.post_attention_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight",
    "midlayer.mlp.down_proj.weight",
}


def test_saved_head_has_the_published_names_shapes_and_config(head, tmp_path):
    save_head(head, tmp_path)
    weights = load_file(str(tmp_path / WEIGHTS_FILE))
    assert set(weights) == PUBLISHED_NAMES | {"embed_tokens.weight"}  # the target's, so the head stands alone
    assert weights["fc.weight"].shape == (HIDDEN, 3 * HIDDEN)
    assert weights["midlayer.self_attn.q_proj.weight"].shape == (4 * 8, 2 * HIDDEN)  # input: embedding + fused hidden
    assert weights["midlayer.self_attn.k_proj.weight"].shape == (2 * 8, 2 * HIDDEN)
    assert weights["lm_head.weight"].shape == (len(DRAFT_VOCAB), HIDDEN)
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].dtype == torch.bool
    assert weights["t2d"].shape == (VOCAB,)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1
    assert (config["vocab_size"], config["draft_vocab_size"]) == (VOCAB, len(DRAFT_VOCAB))
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]


def test_round_trip_restores_every_weight(head, tmp_path):
    save_head(head, tmp_path)
    loaded = load_head(tmp_path, TINY_TARGET.num_layers, head.embed)
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_d2t_and_t2d_map_draft_ids_to_target_ids(head):
    draft_ids = torch.arange(len(DRAFT_VOCAB))
    assert torch.equal(head.to_target(draft_ids), DRAFT_VOCAB)  # target id = draft id + d2t[draft id]
    assert torch.equal(head.t2d.nonzero().squeeze(-1), DRAFT_VOCAB)
    assert int(head.t2d.sum()) == len(DRAFT_VOCAB)


def test_loads_files_with_a_model_prefix_and_without_t2d(head, tmp_path):
    """Some published heads prefix names with "model." or leave t2d out (SGLang derives it from d2t)."""
    save_head(head, tmp_path)
    weights = load_file(str(tmp_path / WEIGHTS_FILE))
    del weights["t2d"]
    (tmp_path / WEIGHTS_FILE).unlink()
    save_file({f"model.{k}" if k.startswith("midlayer") else k: v for k, v in weights.items()}, str(tmp_path / "other.safetensors"))
    loaded = load_head(tmp_path, TINY_TARGET.num_layers, head.embed)
    assert torch.equal(loaded.t2d, head.t2d)
    assert torch.equal(loaded.midlayer.mlp.up_proj.weight, head.midlayer.mlp.up_proj.weight)


def test_a_saved_head_loads_without_the_target_embedding(head, tmp_path):
    save_head(head, tmp_path)
    proposer = load_proposer(tmp_path, TINY_TARGET)
    assert torch.allclose(proposer.head.embed.float(), head.embed, atol=1e-2)
    assert len(proposer.propose([DraftInput("s", list(range(9)), 3, torch.randn(8, 3 * HIDDEN))])[0]) == 3


def test_misshapen_or_missing_weights_are_named(head, tmp_path):
    save_head(head, tmp_path)
    weights = load_file(str(tmp_path / WEIGHTS_FILE))
    weights["fc.weight"] = torch.zeros(HIDDEN, 2 * HIDDEN)
    save_file(weights, str(tmp_path / WEIGHTS_FILE))
    with pytest.raises(HeadFormatError, match="fc.weight"):
        load_head(tmp_path, TINY_TARGET.num_layers, head.embed)
    del weights["fc.weight"]
    save_file(weights, str(tmp_path / WEIGHTS_FILE))
    with pytest.raises(HeadFormatError, match="missing"):
        load_head(tmp_path, TINY_TARGET.num_layers, head.embed)


def test_load_proposer_checks_the_target_and_defaults_aux_layers(head, tmp_path):
    save_head(head, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["eagle_config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    proposer = load_proposer(tmp_path, TINY_TARGET, embed=head.embed)
    assert proposer.aux_layers == (1, 1, 0)  # (1, L/2 - 1, L - 4) for L = 4, as SGLang captures
    wrong_vocab = TINY_TARGET.__class__(**{**TINY_TARGET.to_dict(), "vocab_size": VOCAB * 2})
    with pytest.raises(HeadFormatError, match="vocab_size"):
        load_proposer(tmp_path, wrong_vocab, embed=head.embed)
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(HeadFormatError, match="EAGLE-3"):
        load_proposer(tmp_path, TINY_TARGET, embed=head.embed)
