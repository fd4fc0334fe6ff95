"""The one small interface every draft proposer implements (n-gram lookup, EAGLE-3 heads).

The engine asks for drafts once per step for the sequences that speculate, verifies them in the
target's next forward pass, and commits the accepted prefix. A proposer never affects correctness:
whatever it drafts, the output is the target's.

Positions: a sequence's committed tokens are `token_ids[0..n]`; the newest one, `token_ids[n]`,
was just sampled and has not been through the target yet. For proposers that read the target's
hidden states (`aux_layers` not empty), the engine hands over, for committed positions the proposer
has not been given yet, the outputs of those decoder layers (the residual stream after layer i,
0-based, before the final norm), concatenated in `aux_layers` order: `hidden[j]` belongs to
position `hidden_start + j`. Positions may be skipped (prefix-cache hits are never recomputed;
after a preemption the sequence is recomputed and positions are given again from 0): a proposer
must accept any `hidden_start`, including one at or below what it has already seen, and drop its
own state beyond it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor


@dataclass(slots=True)
class DraftInput:
    seq_id: str  # the engine's request id
    token_ids: list[int]  # committed tokens: prompt + output; the last one not yet through the target
    num_drafts: int  # how many tokens to draft at most (0 or more)
    hidden: Tensor | None = None  # [n, len(aux_layers) * hidden_size], None for proposers without aux_layers
    hidden_start: int = 0  # position of hidden[0]


class Proposer(Protocol):
    # Decoder layers whose outputs the proposer reads; () when it reads only tokens.
    aux_layers: tuple[int, ...]

    def propose(self, inputs: list[DraftInput]) -> list[list[int]]:
        """Drafts for each input, in order; each list holds at most `num_drafts` tokens (may be empty)."""
        ...

    def finish(self, seq_id: str) -> None:
        """Forget a sequence (finished, aborted or preempted for good)."""
        ...
