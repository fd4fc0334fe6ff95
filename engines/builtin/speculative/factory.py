"""Builds the proposer an engine's config asks for (none, ngram or eagle3)."""

from __future__ import annotations

from engines.builtin.config import EngineConfig
from engines.builtin.runner.model_runner import ModelRunner
from engines.builtin.speculative.ngram import NgramProposer
from engines.builtin.speculative.proposer import Proposer


def build_proposer(config: EngineConfig, runner: ModelRunner) -> Proposer | None:
    """None when `config.speculative` is "none"; loads the EAGLE-3 head for "eagle3" (slow)."""
    if config.speculative == "none":
        return None
    if config.speculative == "ngram":
        return NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)
    from engines.builtin.speculative.eagle3 import load_proposer  # torch modules only an EAGLE-3 engine needs

    assert config.speculative_model is not None, "EngineConfig requires it for eagle3"
    return load_proposer(config.speculative_model, runner.model_config, runner.device, runner.dtype,
                         embed=runner.weights.embed, fp16_weights=config.linear_format is not None)
