"""The engine step's speculative half: pick tokens from verify rows, ask the proposer for drafts.

Each step, `sample` turns the logits of the rows that reached the end of their sequence into new
tokens: one per plain row (the sampler, as without speculation), 1 to k + 1 per verify row (see
`rejection`). After the step, `propose` asks the proposer for the next drafts of every sequence
that is decoding, unless more than `max_concurrency` requests are running, and hands proposers
that read the target's hidden states the ones of the positions committed this step.

Draft length adapts per sequence: after a verify step that rejected a draft, the next one drafts at
most one token more than were accepted (a wrong guess is cheap again quickly); after one that
accepted every draft, the full `num_speculative_tokens`. On a CPU a verify row of k + 1 tokens
costs more than a plain decode as k grows, so long drafts are kept for runs that copy.
"""

from __future__ import annotations

from torch import Tensor

from engines.builtin.config import EngineConfig
from engines.builtin.model_runner import ForwardItem
from engines.builtin.sampler import Sampler, has_penalty
from engines.builtin.scheduler import ScheduledChunk
from engines.builtin.sequence import Sequence, SequenceStatus
from engines.builtin.speculative.proposer import DraftInput, Proposer
from engines.builtin.speculative.rejection import accept_greedy, accept_sampled


class Speculator:
    def __init__(self, config: EngineConfig, proposer: Proposer | None, sampler: Sampler, max_model_len: int, vocab_size: int) -> None:
        self.proposer = proposer
        self.sampler = sampler
        self.num_speculative_tokens = config.num_speculative_tokens
        self.max_concurrency = config.speculative_max_concurrency
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.draft_limits: dict[str, int] = {}  # request id -> most drafts for its next verify step
        self.num_draft_tokens = 0  # cumulative, every request
        self.num_accepted_tokens = 0

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return self.proposer.aux_layers if self.proposer is not None else ()

    # ---- verification ----------------------------------------------------------------------

    def sample(self, logits: Tensor, chunks: list[ScheduledChunk], rows: list[int]) -> list[list[int]]:
        """New tokens for each chunk index in `rows`. logits: [sum of 1 + len(drafts) over chunks, V]."""
        seqs = [chunks[i].seq for i in rows]
        if not rows:
            return []
        if not any(chunk.draft_token_ids for chunk in chunks):  # one logits row per chunk
            picked = logits if len(rows) == len(chunks) else logits[rows]
            return [[t] for t in self.sampler(picked, seqs)]
        offsets, offset = [], 0
        for chunk in chunks:
            offsets.append(offset)
            offset += 1 + len(chunk.draft_token_ids)
        plain = [i for i in rows if not chunks[i].draft_token_ids]
        tokens: dict[int, list[int]] = {}
        if plain:
            sampled = self.sampler(logits[[offsets[i] for i in plain]], [chunks[i].seq for i in plain])
            tokens.update((i, [t]) for i, t in zip(plain, sampled))
        for i in rows:
            drafts = chunks[i].draft_token_ids
            if drafts:
                tokens[i] = self.verify(logits[offsets[i] : offsets[i] + 1 + len(drafts)], chunks[i].seq, drafts)
        return [tokens[i] for i in rows]

    def verify(self, logits: Tensor, seq: Sequence, drafts: list[int]) -> list[int]:
        # logits: [k + 1, V], row j after drafts[:j] -> accepted drafts + the target's next token
        if seq.sampling.is_greedy and not has_penalty(seq):
            tokens = accept_greedy(logits.argmax(dim=-1).tolist(), drafts)
        else:
            # row j is sampled as if drafts[:j] were already generated: penalties see them
            views = [_extended(seq, drafts[:j]) for j in range(len(drafts) + 1)]
            logits = self.sampler.prepare_penalised(logits, views)
            if seq.sampling.is_greedy:
                tokens = accept_greedy(logits.argmax(dim=-1).tolist(), drafts)
            else:
                probs = self.sampler.probs(logits, views)
                tokens = accept_sampled(probs, drafts, None, self.sampler.generator_for(seq, logits.device))
        num_accepted = len(tokens) - 1
        limit = self.num_speculative_tokens if num_accepted == len(drafts) else num_accepted + 1
        self.draft_limits[seq.request_id] = limit
        seq.num_verify_steps += 1
        seq.num_draft_tokens += len(drafts)
        seq.num_accepted_tokens += num_accepted
        self.num_draft_tokens += len(drafts)
        self.num_accepted_tokens += num_accepted
        return tokens

    # ---- proposing -------------------------------------------------------------------------

    def propose(self, chunks: list[ScheduledChunk], items: list[ForwardItem], hidden: list[Tensor] | None, num_running: int) -> None:
        """Set `draft_token_ids` of the sequences of this step that now decode (`items` are the
        step's forward items, for the positions they started at)."""
        if self.proposer is None:
            return
        speculate = num_running <= self.max_concurrency
        inputs: list[DraftInput] = []
        targets: list[Sequence] = []
        for i, chunk in enumerate(chunks):
            seq = chunk.seq
            if seq.status is not SequenceStatus.RUNNING:  # finished or preempted during the step
                continue
            num_drafts = self.num_drafts(seq) if speculate and not seq.is_prefilling else 0
            if hidden is None and num_drafts == 0:
                continue
            draft_input = DraftInput(seq.request_id, seq.token_ids, num_drafts)
            if hidden is not None:  # the committed positions of this step only
                draft_input.hidden = hidden[i][: seq.num_computed_tokens - items[i].start_pos]
                draft_input.hidden_start = items[i].start_pos
            inputs.append(draft_input)
            targets.append(seq)
        if not inputs:
            return
        for seq, draft_input, drafts in zip(targets, inputs, self.proposer.propose(inputs), strict=True):
            drafts = drafts[: draft_input.num_drafts]
            if all(isinstance(t, int) and 0 <= t < self.vocab_size for t in drafts):
                seq.draft_token_ids = drafts

    def num_drafts(self, seq: Sequence) -> int:
        # each verify step emits up to drafts + 1 tokens, all within max_tokens and the context;
        # a guided sequence gets none (its grammar would have to check every draft position)
        if seq.matcher is not None:
            return 0
        limit = self.draft_limits.get(seq.request_id, self.num_speculative_tokens)
        return max(0, min(limit, seq.num_tokens_left - 1, self.max_model_len - len(seq)))

    def finish(self, seq: Sequence) -> None:
        self.draft_limits.pop(seq.request_id, None)
        if self.proposer is not None:
            self.proposer.finish(seq.request_id)


def _extended(seq: Sequence, drafts: list[int]) -> Sequence:
    """A stand-in for `seq` with `drafts` generated after its tokens (for penalties)."""
    view = Sequence(seq.request_id, seq.token_ids + drafts, seq.sampling)
    view.num_prompt_tokens = seq.num_prompt_tokens
    return view
