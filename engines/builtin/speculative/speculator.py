"""The engine step's speculative half: pick tokens from verify rows, ask the proposer for drafts.

Each step, `sample` turns the logits of the rows that reached the end of their sequence into new
tokens: one per plain row (the sampler, as without speculation), 1 to k + 1 per verify row (see
`rejection`). After the step, `propose` asks the proposer for the next drafts of every sequence
that is decoding, unless more than `max_concurrency` requests are running, and hands proposers
that read the target's hidden states the ones of the positions committed this step.

Draft length adapts per sequence (`draft_policy`): the engine reports how long each batch-1 step
took (`observe_step`), the speculator times the proposer and counts each sequence's accepted
drafts, and the policy drafts the length with the best expected tokens per unit of cost, none when
drafting does not pay. A sequence that drafts nothing gets unverified shadow drafts, checked
against the token the target commits, so that it can start again when its text turns to copying.
"""

from __future__ import annotations

import time

from torch import Tensor

from engines.builtin.config import EngineConfig
from engines.builtin.engine.scheduler import ScheduledChunk
from engines.builtin.engine.sequence import Sequence, SequenceStatus
from engines.builtin.runner.model_runner import ForwardItem
from engines.builtin.runner.sampler import Sampler, greedy_ids, has_penalty
from engines.builtin.speculative.draft_policy import DraftPolicy, StepCosts
from engines.builtin.speculative.proposer import DraftInput, Proposer
from engines.builtin.speculative.rejection import accept_greedy, accept_sampled

PRIOR_VERIFY_COST = 0.25  # one more token in a batch-1 verify row, in decode steps, until measured (BENCHMARKS.md)


class Speculator:
    def __init__(self, config: EngineConfig, proposer: Proposer | None, sampler: Sampler, max_model_len: int, vocab_size: int) -> None:
        self.proposer = proposer
        self.sampler = sampler
        self.num_speculative_tokens = config.num_speculative_tokens
        self.max_concurrency = config.speculative_max_concurrency
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.policy = DraftPolicy(config.num_speculative_tokens, StepCosts(PRIOR_VERIFY_COST)) if config.speculative_adaptive else None
        # wall time, what a stream waits for: CPU time sums the threads, and a decode on two threads spends
        # more of it than a verify row does, which made drafts look cheaper than they were; StepCosts takes medians,
        # so preempted steps do not move it
        self.clock = time.perf_counter
        self.shadows: dict[str, int] = {}  # request id -> its unverified shadow draft of the next token
        self.num_draft_tokens = 0  # cumulative, every request
        self.num_accepted_tokens = 0

    @property
    def aux_layers(self) -> tuple[int, ...]:
        return self.proposer.aux_layers if self.proposer is not None else ()

    # ---- verification ----------------------------------------------------------------------

    def sample(self, logits: Tensor, chunks: list[ScheduledChunk], rows: list[int]) -> list[list[int]]:
        """New tokens for each chunk index in `rows`. logits: [sum of 1 + len(drafts) over chunks, V]."""
        tokens = self.sample_rows(logits, chunks, rows)
        if self.shadows:
            for i, new in zip(rows, tokens):
                self.check_shadow(chunks[i].seq, new[0])
        return tokens

    def sample_rows(self, logits: Tensor, chunks: list[ScheduledChunk], rows: list[int]) -> list[list[int]]:
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
            tokens = accept_greedy(greedy_ids(logits), drafts)
        else:
            # row j is sampled as if drafts[:j] were already generated: penalties see them
            views = [_extended(seq, drafts[:j]) for j in range(len(drafts) + 1)]
            logits = self.sampler.prepare_penalised(logits, views)
            if seq.sampling.is_greedy:
                tokens = accept_greedy(greedy_ids(logits), drafts)
            else:
                probs = self.sampler.probs(logits, views)
                tokens = accept_sampled(probs, drafts, None, self.sampler.generator_for(seq, logits.device))
        num_accepted = len(tokens) - 1
        if self.policy is not None:
            self.policy.observe(seq.request_id, len(drafts), num_accepted)
        seq.num_verify_steps += 1
        seq.num_draft_tokens += len(drafts)
        seq.num_accepted_tokens += num_accepted
        self.num_draft_tokens += len(drafts)
        self.num_accepted_tokens += num_accepted
        return tokens

    def check_shadow(self, seq: Sequence, token: int) -> None:
        shadow = self.shadows.pop(seq.request_id, None)
        if shadow is not None and self.policy is not None:
            self.policy.observe(seq.request_id, 1, int(token == shadow))

    def observe_step(self, items: list[ForwardItem], seconds: float) -> None:
        """The target's time for one step; batch-1 decode and verify steps teach the cost model."""
        if self.policy is not None and len(items) == 1 and (len(items[0].token_ids) == 1 or items[0].is_verify):
            self.policy.costs.observe_step(len(items[0].token_ids), seconds)

    # ---- proposing -------------------------------------------------------------------------

    def propose(self, chunks: list[ScheduledChunk], items: list[ForwardItem], hidden: list[Tensor] | None, num_running: int) -> None:
        """Set `draft_token_ids` of the sequences of this step that now decode (`items` are the
        step's forward items, for the positions they started at)."""
        if self.proposer is None:
            return
        speculate = num_running <= self.max_concurrency
        inputs: list[DraftInput] = []
        targets: list[Sequence] = []
        shadowed: set[str] = set()  # sequences whose one draft is a shadow: checked, never verified
        for i, chunk in enumerate(chunks):
            seq = chunk.seq
            if seq.status is not SequenceStatus.RUNNING:  # finished or preempted during the step
                continue
            may_draft = speculate and not seq.is_prefilling
            num_drafts = self.num_drafts(seq) if may_draft else 0
            if num_drafts == 0 and may_draft and self.may_shadow(seq):
                shadowed.add(seq.request_id)
                num_drafts = 1
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
        started = self.clock()
        proposed = self.proposer.propose(inputs)
        seconds, num_proposed = self.clock() - started, 0
        for seq, draft_input, drafts in zip(targets, inputs, proposed, strict=True):
            drafts = drafts[: draft_input.num_drafts]
            num_proposed += len(drafts)
            if not all(isinstance(t, int) and 0 <= t < self.vocab_size for t in drafts):
                drafts = []
            if seq.request_id not in shadowed:
                seq.draft_token_ids = drafts
            elif drafts:
                self.shadows[seq.request_id] = drafts[0]
        if self.policy is not None:
            self.policy.costs.observe_drafts(num_proposed, seconds)

    def may_shadow(self, seq: Sequence) -> bool:
        return (self.policy is not None and seq.matcher is None and seq.num_tokens_left > 1
                and self.policy.wants_shadow(seq.request_id))

    def num_drafts(self, seq: Sequence) -> int:
        # each verify step emits up to drafts + 1 tokens, all within max_tokens and the context;
        # a guided sequence gets none (its grammar would have to check every draft position)
        if seq.matcher is not None:
            return 0
        limit = self.num_speculative_tokens if self.policy is None else self.policy.num_drafts(seq.request_id)
        return max(0, min(limit, seq.num_tokens_left - 1, self.max_model_len - len(seq)))

    def finish(self, seq: Sequence) -> None:
        self.shadows.pop(seq.request_id, None)
        if self.policy is not None:
            self.policy.finish(seq.request_id)
        if self.proposer is not None:
            self.proposer.finish(seq.request_id)


def _extended(seq: Sequence, drafts: list[int]) -> Sequence:
    """A stand-in for `seq` with `drafts` generated after its tokens (for penalties)."""
    view = Sequence(seq.request_id, seq.token_ids + drafts, seq.sampling)
    view.num_prompt_tokens = seq.num_prompt_tokens
    return view
