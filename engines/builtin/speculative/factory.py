"""Builds the proposer an engine's config asks for (none, ngram or eagle3)."""

from __future__ import annotations

import torch

from engines.builtin.config import EngineConfig
from engines.builtin.model_config import ModelConfig
from engines.builtin.speculative.ngram import NgramProposer
from engines.builtin.speculative.proposer import Proposer


def build_proposer(config: EngineConfig, target: ModelConfig, device: torch.device, dtype: torch.dtype) -> Proposer | None:
    """None when `config.speculative` is "none"; loads the EAGLE-3 head for "eagle3" (slow)."""
    if config.speculative == "none":
        return None
    if config.speculative == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    try:
        from engines.builtin.speculative.eagle3 import load_proposer
    except ImportError as exc:
        raise RuntimeError("speculative='eagle3' needs engines.builtin.speculative.eagle3, which is not installed here") from exc
    return load_proposer(config.speculative_model, target, device, dtype)
