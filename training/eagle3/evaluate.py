"""How well a head drafts for its target: mean accepted length at k = 1..max_k drafts.

Replays greedy conversations through the proposer as the engine would feed it, one committed
token at a time: at each answer position n it drafts `max_k` tokens from the hidden states of
positions < n, and counts how many lead the target's own continuation. With a chain of k drafts
and greedy verification, a step accepts min(k, that count) drafts plus the target's own token, so
tokens per target pass = 1 + mean accepted length (what speculation can at best gain).
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.builtin.speculative.eagle3.proposer import Eagle3Proposer
from engines.builtin.speculative.proposer import DraftInput
from training.eagle3.dataset import Conversation


@dataclass(slots=True)
class Acceptance:
    mean_accepted: list[float]  # [k-1]: mean accepted drafts with a chain of k
    num_positions: int

    def as_dict(self) -> dict[str, float]:
        return {f"k={k + 1}": round(v, 3) for k, v in enumerate(self.mean_accepted)} | {"positions": self.num_positions}


def acceptance(proposer: Eagle3Proposer, conversations: list[Conversation], max_k: int = 4) -> Acceptance:
    totals = [0] * max_k
    num_positions = 0
    for index, conv in enumerate(conversations):
        seq_id = f"eval-{index}"
        tokens = conv.token_ids.tolist()
        hidden_end = 0
        for n in range(conv.prompt_len, len(tokens) - 1):
            # committed tokens[0..n]; the target has run positions < n
            item = DraftInput(seq_id, tokens[: n + 1], max_k, conv.aux[hidden_end:n], hidden_end)
            hidden_end = n
            drafts = proposer.propose([item])[0]
            truth = tokens[n + 1 : n + 1 + max_k]
            run = 0
            while run < min(len(drafts), len(truth)) and drafts[run] == truth[run]:
                run += 1
            for k in range(max_k):
                totals[k] += min(k + 1, run)
            num_positions += 1
        proposer.finish(seq_id)
    return Acceptance([t / max(1, num_positions) for t in totals], num_positions)
