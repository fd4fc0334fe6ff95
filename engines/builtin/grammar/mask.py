"""Applying a grammar's token bitmask to logits.

A bitmask row holds one bit per vocabulary id, packed into int32 words (bit j of word i is token
32 * i + j), as xgrammar and llguidance both write it. A cleared bit forbids the token: its logit
becomes -inf, so greedy and sampled picks alike stay inside the grammar.
"""

from __future__ import annotations

import torch

_BITS = torch.arange(32, dtype=torch.int32)


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """[rows, ceil(V / 32)] int32, every token allowed."""
    return torch.full((rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    # bitmask: [B, W] int32 -> allowed: [B, V] bool, with V <= 32 * W
    bits = (bitmask.unsqueeze(-1) >> _BITS.to(bitmask.device)) & 1  # [B, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Forbidden tokens' logits set to -inf, in place; logits: [B, V] float, bitmask: [B, W] int32.
    A model head wider than the tokenizer (padding ids past 32 * W) has those ids forbidden too."""
    vocab = logits.shape[-1]
    covered = min(vocab, bitmask.shape[-1] * 32)
    allowed = unpack_bitmask(bitmask.to(logits.device), covered)
    logits[:, :covered].masked_fill_(~allowed, float("-inf"))
    if covered < vocab:
        logits[:, covered:] = float("-inf")
    return logits
