"""Starting a request from KV computed elsewhere (the generation step of disaggregated serving).

`reserve_import` gives the request blocks for its whole prompt, reusing this engine's own prefix
cache (the same tenant-salted hashes the prefill side used), and says which blocks still need
their contents: those past the local hits. The caller fills them (a KV transfer) while the
engine goes on stepping other requests - the sequence is IMPORTING, outside the scheduler, so
nothing reads or writes its blocks meanwhile. `finish_import` then marks the prompt computed,
registers its full blocks in the prefix cache and continues from the first token the prefill
side sampled, exactly as if this engine had prefilled the prompt itself: the sequence joins the
running batch through the scheduler (`add_imported`), so `max_num_seqs` bounds it like any other. `abort` works at any
point (scheduler.finish frees an IMPORTING sequence's blocks).

These functions run on the engine thread (`AsyncEngine.call`).
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.base import GenerationOutput, GenerationRequest
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.engine.sequence import SequenceStatus
from engines.errors import EngineOverloaded, InvalidRequest


@dataclass(slots=True, frozen=True)
class ImportPlan:
    """Blocks [first_block, first_block + len(block_ids)) of the prompt must be filled."""

    first_block: int
    block_ids: list[int]
    num_cached_tokens: int  # prompt tokens found in this engine's own prefix cache


def reserve_import(engine: LLMEngine, request: GenerationRequest) -> ImportPlan:
    engine.add_request(request)  # validates and registers; queued, taken back out below
    seq = engine.seqs[request.request_id]
    scheduler, blocks = engine.scheduler, engine.block_manager
    scheduler.waiting.remove(seq)
    if not blocks.can_allocate(seq):
        del engine.seqs[seq.request_id], engine.streams[seq.request_id]
        raise EngineOverloaded("no free KV blocks for the imported prompt: retry later or use another backend")
    num_cached = blocks.allocate(seq)
    seq.status = SequenceStatus.IMPORTING
    seq.num_cached_tokens = num_cached
    scheduler.num_prefix_hit_tokens += num_cached
    scheduler.num_prompt_tokens += seq.num_prompt_tokens
    first = num_cached // blocks.block_size
    return ImportPlan(first, list(seq.block_table[first:]), num_cached)


def finish_import(engine: LLMEngine, request_id: str, first_token_id: int) -> GenerationOutput:
    """The blocks are filled: run on from `first_token_id` (its output is returned, maybe final)."""
    seq = engine.seqs.get(request_id)
    if seq is None or seq.status is not SequenceStatus.IMPORTING:
        raise InvalidRequest(f"request {request_id!r} is not waiting for imported KV (aborted?)")
    if not 0 <= first_token_id < engine.vocab_size:
        engine.abort(request_id)
        raise InvalidRequest(f"first_gen_tokens holds {first_token_id}, outside the vocabulary")
    seq.num_computed_tokens = len(seq)
    engine.block_manager.commit_computed(seq)
    engine.scheduler.add_imported(seq)
    return engine.postprocess(seq, [first_token_id])
