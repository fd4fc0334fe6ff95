"""What the engine tests (and benchmarks) need of a model that the engine itself never does: its parameter
count, a GGUF's tokenizer alone."""

from __future__ import annotations

from pathlib import Path

import gguf

from engines.builtin.loader.gguf import read_config, read_tokenizer
from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.text.tokenizer import Tokenizer


def num_params(config: ModelConfig) -> int:
    d, hd, i = config.hidden_size, config.head_dim, config.intermediate_size
    per_layer = d * hd * (2 * config.num_heads + 2 * config.num_kv_heads) + 3 * d * i + 2 * d
    head = 0 if config.tie_word_embeddings else config.vocab_size * d
    return config.num_layers * per_layer + config.vocab_size * d + head + d


def read_gguf_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer of a GGUF file alone (no weights read)."""
    reader = gguf.GGUFReader(path)
    return read_tokenizer(reader, read_config(reader, {t.name for t in reader.tensors}))
