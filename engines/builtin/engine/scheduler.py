"""Continuous batching with chunked prefill: decides which tokens go through the model each step.

Each step has a budget of `max_num_batched_tokens` tokens. Running sequences that are decoding
get their one token first (oldest first), then running sequences still prefilling get chunks of
their prompt, then waiting sequences are admitted (FIFO) while the budget, `max_num_seqs` and the
KV cache allow. Prompts whose KV arrived from another backend (`add_imported`: the generation step
of disaggregated serving) already hold their blocks and only decode; they take a running slot
before the waiting queue does, under the same `max_num_seqs`. A long prompt is therefore spread over several steps while everyone else keeps
decoding. When a decode needs a new KV block and none is left, the most recently admitted running
sequence is preempted: its blocks are released and it goes back to the head of the queue, to be
prefilled again later (generated tokens included) — recomputation, never a corrupted cache.

Speculative decoding: a decoding sequence with `draft_token_ids` runs them after its last token in
the same row when the budget and free blocks allow (never preempting anyone for a draft); after
verification `accept_drafts` counts the accepted ones as computed and frees the rejected ones' slots.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engines.base import FinishReason
from engines.builtin.config import EngineConfig
from engines.builtin.engine.block_manager import BlockManager
from engines.builtin.engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledChunk:
    """`num_tokens` tokens of `seq`, starting at its first uncomputed position, then drafts to verify."""

    seq: Sequence
    num_tokens: int
    draft_token_ids: list[int] = field(default_factory=list)

    @property
    def start_pos(self) -> int:
        return self.seq.num_computed_tokens

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start_pos : self.start_pos + self.num_tokens] + self.draft_token_ids


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager) -> None:
        self.max_num_seqs = config.max_num_seqs
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self.block_manager = block_manager
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order
        self.imported: deque[Sequence] = deque()  # KV in place (kv_handoff.py), waiting for a running slot
        self.num_preemptions = 0
        self.num_prefix_hit_tokens = 0
        self.num_prompt_tokens = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def add_imported(self, seq: Sequence) -> None:
        """`seq`'s prompt KV is computed (pulled from another backend) and its blocks are held:
        it decodes once a running slot is free."""
        seq.status = SequenceStatus.IMPORTED
        self.imported.append(seq)

    def schedule(self) -> list[ScheduledChunk]:
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted = False

        while self.imported and len(self.running) < self.max_num_seqs:  # they hold blocks: run them first
            seq = self.imported.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)

        for seq in list(self.running):  # decodes first, oldest first
            if seq.status is not SequenceStatus.RUNNING or seq.is_prefilling or budget == 0:
                continue
            drafts = self._take_drafts(seq, budget)
            if drafts:
                chunks.append(ScheduledChunk(seq, 1, drafts))
                budget -= 1 + len(drafts)
                continue
            while not self.block_manager.may_append(seq, len(seq)):
                victim = self.running[-1]
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                chunks.append(ScheduledChunk(seq, 1))
                budget -= 1

        for seq in self.running:  # then chunks of prompts already admitted
            if budget == 0:
                break
            if seq.is_prefilling:
                num_tokens = min(seq.num_uncomputed_tokens, budget)
                chunks.append(ScheduledChunk(seq, num_tokens))
                budget -= num_tokens

        while not preempted and self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not self.block_manager.can_allocate(seq):
                break
            self.waiting.popleft()
            self._admit(seq)
            num_tokens = min(seq.num_uncomputed_tokens, budget)
            chunks.append(ScheduledChunk(seq, num_tokens))
            budget -= num_tokens
        return chunks

    def _take_drafts(self, seq: Sequence, budget: int) -> list[int]:
        """The drafts `seq` can verify this step (blocks reserved), or [] to decode plainly."""
        drafts, seq.draft_token_ids = seq.draft_token_ids[: budget - 1], []
        if drafts and self.block_manager.may_append(seq, len(seq) + len(drafts)):
            return drafts
        return []

    def accept_drafts(self, seq: Sequence, num_accepted: int) -> None:
        """The first `num_accepted` drafts verified after the sequence's last computed token are now
        in `token_ids` with their KV computed: count them, register the blocks they fill, and free
        the blocks that only rejected drafts used."""
        seq.num_computed_tokens += num_accepted
        assert seq.num_computed_tokens == len(seq) - 1, f"{seq.request_id}: accepted drafts out of step"
        self.block_manager.commit_computed(seq)
        self.block_manager.trim(seq, len(seq))

    def _admit(self, seq: Sequence) -> None:
        num_cached = self.block_manager.allocate(seq)
        if seq.num_cached_tokens is None:  # first admission: this is what the request is billed for
            seq.num_cached_tokens = num_cached
            self.num_prefix_hit_tokens += num_cached
            self.num_prompt_tokens += seq.num_prompt_tokens
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.WAITING
        seq.draft_token_ids = []
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def update(self, chunks: list[ScheduledChunk]) -> list[int]:
        """Record that `chunks` went through the model; returns the indices of chunks that
        reached the end of their sequence (a token must be sampled from their logits)."""
        finished_rows = []
        for i, chunk in enumerate(chunks):
            seq = chunk.seq
            seq.num_computed_tokens += chunk.num_tokens
            self.block_manager.commit_computed(seq)
            if seq.num_computed_tokens == len(seq):
                finished_rows.append(i)
        return finished_rows

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Retire `seq` (finished or aborted) and release its blocks, wherever it is."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self.block_manager.deallocate(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        elif seq.status is SequenceStatus.IMPORTED:
            self.imported.remove(seq)
            self.block_manager.deallocate(seq)
        elif seq.status is SequenceStatus.IMPORTING:
            self.block_manager.deallocate(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def num_prefill_tokens(self) -> int:
        return sum(s.num_uncomputed_tokens for s in self.waiting) + sum(
            s.num_uncomputed_tokens for s in self.running if s.is_prefilling
        )

    def num_decode_tokens(self) -> int:
        return sum(s.num_tokens_left for s in self.running) + sum(s.num_tokens_left for s in self.imported)
