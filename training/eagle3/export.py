"""Write a head as the directory `--speculative-model DIR` loads: config.json + model.safetensors, in the
published layout that engines/builtin/speculative/eagle3/checkpoint.py reads (SGLang and TensorRT-LLM read it
too). The head carries its embedding (float16), so a loader that passes no target embedding still works."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import Tensor

from engines.builtin.speculative.eagle3.checkpoint import WEIGHTS_FILE
from engines.builtin.speculative.eagle3.model import Eagle3Head


def set_vocab(head: Eagle3Head, draft_to_target: Tensor) -> None:
    """draft_to_target [draft_vocab] sorted target ids -> the head's d2t offsets and t2d mask."""
    ids = draft_to_target.long()
    head.d2t.copy_(ids - torch.arange(len(ids)))
    head.t2d.zero_()
    head.t2d[ids] = True


def save_head(head: Eagle3Head, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    state = {name: t.detach().contiguous().cpu() for name, t in head.state_dict().items()}
    if head.embed is not None:
        state["embed_tokens.weight"] = head.embed.detach().to(device="cpu", dtype=torch.float16).contiguous()
    save_file(state, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(head.config.to_hf(), indent=2) + "\n")
