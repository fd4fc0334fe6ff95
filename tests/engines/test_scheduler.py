"""Scheduler decisions on their own (no model): chunked prefill, decode priority, limits, preemption.

Each "step" here does what LLMEngine.step does around the model: schedule, mark the chunks
computed, append a made-up token to each sequence that reached its end.
"""

from __future__ import annotations

from engines.builtin.config import EngineConfig
from engines.builtin.engine.block_manager import BlockManager
from engines.builtin.engine.scheduler import ScheduledChunk, Scheduler
from engines.builtin.engine.sequence import Sequence, SequenceStatus
from engines.sampling_params import SamplingParams


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 4, budget: int = 16) -> Scheduler:
    config = EngineConfig(
        model="random:tiny", block_size=block_size, num_kv_blocks=num_blocks,
        max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
    )
    return Scheduler(config, BlockManager(num_blocks, block_size))


def make_seq(request_id: str, num_prompt: int, max_tokens: int = 8) -> Sequence:
    base = 1000 * (1 + sum(map(ord, request_id)))  # distinct prompts: no prefix cache hits between them
    return Sequence(request_id, [base + i for i in range(num_prompt)], SamplingParams(max_tokens=max_tokens))


def step(scheduler: Scheduler) -> list[ScheduledChunk]:
    chunks = scheduler.schedule()
    for i in scheduler.update(chunks):
        seq = chunks[i].seq
        seq.token_ids.append(7)
        if seq.num_generated_tokens >= seq.sampling.max_tokens:
            scheduler.finish(seq, "length")
    return chunks


def shape_of(chunks: list[ScheduledChunk]) -> list[tuple[str, int]]:
    return [(c.seq.request_id, c.num_tokens) for c in chunks]


def test_long_prompt_is_chunked_while_others_keep_decoding() -> None:
    s = make_scheduler(budget=16)
    s.add(make_seq("short", 3))
    assert shape_of(step(s)) == [("short", 3)]  # prefill of "short" -> its first token
    s.add(make_seq("long", 40))
    chunks = step(s)
    assert shape_of(chunks) == [("short", 1), ("long", 15)]  # the decode comes first, the prompt gets the rest
    chunks = step(s)
    assert shape_of(chunks) == [("short", 1), ("long", 15)]
    chunks = step(s)
    assert shape_of(chunks) == [("short", 1), ("long", 10)]  # last chunk: 40 = 15 + 15 + 10
    long = next(q for q in s.running if q.request_id == "long")
    assert long.num_generated_tokens == 1
    assert long.num_computed_tokens == 40


def test_every_step_respects_budget_and_max_num_seqs() -> None:
    s = make_scheduler(max_num_seqs=3, budget=12)
    for i in range(6):
        s.add(make_seq(f"r{i}", 5 + i, max_tokens=3))
    for _ in range(100):
        if not (s.waiting or s.running):
            break
        chunks = step(s)
        assert sum(c.num_tokens for c in chunks) <= 12
        assert len(s.running) <= 3
        assert len({id(c.seq) for c in chunks}) == len(chunks)
    assert not s.waiting and not s.running
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks


def test_admission_waits_for_blocks_in_fifo_order() -> None:
    s = make_scheduler(num_blocks=6, block_size=4, budget=32)
    s.add(make_seq("a", 16, max_tokens=2))  # 4 blocks
    s.add(make_seq("b", 12, max_tokens=2))  # 3 blocks: does not fit next to a
    s.add(make_seq("c", 2, max_tokens=2))  # would fit, but FIFO keeps it behind b
    step(s)
    assert [q.request_id for q in s.running] == ["a"]
    assert [q.request_id for q in s.waiting] == ["b", "c"]


def test_preempts_most_recent_sequence_when_blocks_run_out() -> None:
    s = make_scheduler(num_blocks=5, block_size=4, budget=32)
    first, second = make_seq("first", 7, max_tokens=12), make_seq("second", 7, max_tokens=12)
    s.add(first)
    s.add(second)
    step(s)  # both prefilled: 2 blocks each, 1 free
    assert [q.request_id for q in s.running] == ["first", "second"]
    for _ in range(3):
        step(s)
    # Both now hold 8+ tokens + a pending token that needs a third block; only one exists.
    assert s.num_preemptions == 1
    assert second.status is SequenceStatus.WAITING and s.waiting[0] is second
    assert second.block_table == [] and second.num_computed_tokens == 0
    kept = second.num_generated_tokens
    assert kept > 0  # generated tokens survive the preemption
    while first.status is not SequenceStatus.FINISHED:
        step(s)
    # Re-admitted: prefills prompt + generated tokens again, then continues.
    chunks = step(s)
    assert shape_of(chunks) == [("second", 7 + kept)]
    while s.waiting or s.running:
        step(s)
    assert second.num_generated_tokens == 12
    assert s.block_manager.num_free_blocks == 5


def test_finish_releases_a_waiting_or_running_sequence() -> None:
    s = make_scheduler()
    a, b = make_seq("a", 5), make_seq("b", 5)
    s.add(a)
    step(s)
    s.add(b)
    s.finish(b, "abort")
    s.finish(a, "abort")
    assert not s.waiting and not s.running
    assert a.finish_reason == "abort" and b.status is SequenceStatus.FINISHED
    assert s.block_manager.num_free_blocks == s.block_manager.num_blocks
