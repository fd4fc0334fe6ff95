"""A tiny random EAGLE-3 head and target for the head's tests (head quality never matters here)."""

from __future__ import annotations

import pytest
import torch

from engines.builtin.runner.model_config import ModelConfig
from engines.builtin.speculative.eagle3.config import Eagle3Config
from engines.builtin.speculative.eagle3.model import Eagle3Head
from training.eagle3.export import set_vocab

VOCAB, HIDDEN = 96, 32
DRAFT_VOCAB = torch.arange(0, VOCAB, 3)  # 32 draft tokens: every third target id

TINY_TARGET = ModelConfig(
    num_layers=4, hidden_size=HIDDEN, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
    vocab_size=VOCAB, max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
)


def tiny_head_config() -> Eagle3Config:
    return Eagle3Config(hidden_size=HIDDEN, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                        vocab_size=VOCAB, draft_vocab_size=len(DRAFT_VOCAB), aux_layers=(0, 1, 2))


def random_head(seed: int = 0) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(tiny_head_config(), torch.randn(VOCAB, HIDDEN))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.3)
    set_vocab(head, DRAFT_VOCAB)
    return head.eval()


@pytest.fixture
def head() -> Eagle3Head:
    return random_head()


def random_head_for(runner) -> Eagle3Head:
    """A random head shaped for `runner`'s target (aux layers 0, 1, 1; every second of the first 256 ids)."""
    t = runner.model_config
    torch.manual_seed(0)
    head = Eagle3Head(Eagle3Config(hidden_size=t.hidden_size, num_heads=t.num_heads, num_kv_heads=t.num_kv_heads,
                                   head_dim=t.head_dim, intermediate_size=t.intermediate_size, vocab_size=t.vocab_size,
                                   draft_vocab_size=128, aux_layers=(0, 1, 1)), runner.weights.embed)
    set_vocab(head, torch.arange(0, 256, 2))
    return head
