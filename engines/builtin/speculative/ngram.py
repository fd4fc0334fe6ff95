"""N-gram prompt lookup (vLLM's `ngram` method): drafts copied from the sequence's own context.

Tool calls, JSON and code edits repeat long runs of their context. The proposer takes the last n
tokens of the sequence (n from `prompt_lookup_max` down to `prompt_lookup_min`), finds the latest
earlier place where they occur, and drafts the tokens that followed there. No model, no training:
a wrong draft only costs its verification slot.
"""

from __future__ import annotations

from engines.builtin.speculative.proposer import DraftInput


def lookup(token_ids: list[int], num_drafts: int, min_n: int, max_n: int) -> list[int]:
    """The tokens after the latest earlier occurrence of the longest suffix of `token_ids` that is
    at least `min_n` and at most `max_n` tokens long (ties: the latest); [] without one."""
    if num_drafts <= 0:
        return []
    last = len(token_ids) - 1
    best_len, best_end = 0, -1
    target = token_ids[last]
    # i: where a candidate match ends (a position < last whose token equals the last token)
    for i in range(last - 1, -1, -1):
        if token_ids[i] != target:
            continue
        n = 1
        while n < max_n and n <= i and token_ids[i - n] == token_ids[last - n]:
            n += 1
        if n > best_len:
            best_len, best_end = n, i
            if n == max_n:
                break
    if best_len < min_n:
        return []
    return token_ids[best_end + 1 : best_end + 1 + num_drafts]


class NgramProposer:
    aux_layers: tuple[int, ...] = ()

    def __init__(self, prompt_lookup_min: int, prompt_lookup_max: int) -> None:
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max

    def propose(self, inputs: list[DraftInput]) -> list[list[int]]:
        return [lookup(i.token_ids, i.num_drafts, self.min_n, self.max_n) for i in inputs]

    def finish(self, seq_id: str) -> None:
        pass  # stateless
