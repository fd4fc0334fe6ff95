"""Read EAGLE-3 head directories: config.json + model.safetensors, as published (training/eagle3/export.py writes them).

Weight names (SGLang's llama_eagle3.py and TensorRT-LLM load these; some files prefix them with
"model."): fc.weight [D, 3*D_target]; midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight;
midlayer.self_attn.{q,k,v}_proj.weight [*, 2*D], o_proj; midlayer.mlp.{gate,up,down}_proj.weight;
norm.weight; lm_head.weight [draft_vocab, D]; d2t [draft_vocab] int64 (target id = draft id + d2t);
t2d [vocab] bool. An optional embed_tokens.weight [vocab, D] is used when no target embedding is
given; heads edgerun trains carry one (float16).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor

from engines.builtin.speculative.eagle3.config import Eagle3Config
from engines.builtin.speculative.eagle3.model import Eagle3Head

WEIGHTS_FILE = "model.safetensors"


class HeadFormatError(ValueError):
    """The directory is not an EAGLE-3 head this loader understands; the message says what is off."""


def read_weights(directory: Path) -> dict[str, Tensor]:
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise HeadFormatError(f"{directory} holds no *.safetensors file")
    state: dict[str, Tensor] = {}
    for path in files:
        state.update(load_file(str(path)))
    return {name.removeprefix("model."): t for name, t in state.items()}


def load_head(directory: Path, num_target_layers: int, embed: Tensor | None = None) -> Eagle3Head:
    """Build a head from `directory`; raises HeadFormatError naming the first missing or misshapen weight."""
    directory = Path(directory).expanduser()
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise HeadFormatError(f"{directory} has no config.json: pass an EAGLE-3 head directory")
    try:
        config = Eagle3Config.from_hf(json.loads(config_path.read_text()), num_target_layers)
    except (KeyError, ValueError) as exc:
        raise HeadFormatError(f"{config_path}: {exc}") from exc
    state = read_weights(directory)
    if embed is None:
        embed = state.get("embed_tokens.weight")
        if embed is None:
            raise HeadFormatError(f"{directory} has no embed_tokens.weight and no target embedding was given")
    head = Eagle3Head(config, embed)
    expected = head.state_dict()
    if "d2t" not in state and config.draft_vocab_size == config.vocab_size:
        state["d2t"] = torch.zeros(config.vocab_size, dtype=torch.long)  # the draft vocabulary is the target's
    if "t2d" not in state and "d2t" in state:
        state["t2d"] = torch.zeros(config.vocab_size, dtype=torch.bool)
        state["t2d"][state["d2t"].long() + torch.arange(len(state["d2t"]))] = True
    for name, tensor in expected.items():
        if name not in state:
            raise HeadFormatError(f"{directory}: weight {name!r} is missing")
        if tuple(state[name].shape) != tuple(tensor.shape):
            raise HeadFormatError(f"{directory}: {name} has shape {tuple(state[name].shape)}, config.json implies {tuple(tensor.shape)}")
    head.load_state_dict({name: state[name].to(expected[name].dtype) for name in expected})
    return head
