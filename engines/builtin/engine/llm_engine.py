"""The synchronous engine: requests in, one `step()` at a time, output deltas out.

Not thread-safe: one thread owns it (`AsyncEngine` runs it in its worker thread).
"""

from __future__ import annotations

from pathlib import Path

import torch

from contracts.prefix_hash import adapter_salt
from engines.base import EngineStats, FinishReason, GenerationOutput, GenerationRequest, KVCacheEvent
from engines.builtin.config import EngineConfig
from engines.builtin.engine.adapters import ResidentAdapters
from engines.builtin.engine.block_manager import BlockManager
from engines.builtin.engine.host_tier import HostTier, KVBlockIO
from engines.builtin.engine.kv_events import KVEventLog
from engines.builtin.engine.kv_pins import KVPins
from engines.builtin.engine.scheduler import ScheduledChunk, Scheduler
from engines.builtin.engine.sequence import Sequence
from engines.builtin.grammar.cache import GrammarCache
from engines.builtin.grammar.llguidance_backend import LLGuidanceBackend
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner
from engines.builtin.runner.sampler import Sampler
from engines.builtin.speculative.factory import build_proposer
from engines.builtin.speculative.proposer import Proposer
from engines.builtin.speculative.speculator import Speculator
from engines.builtin.text.detokenizer import TextStream
from engines.errors import EngineOverloaded, InvalidRequest


class LLMEngine:
    """Paged-KV, prefix-cached, continuously batched generation on one `ModelRunner`.

    Pass `runner` to share an already loaded model (its KV cache must hold at least
    `config.num_kv_blocks` blocks of `config.block_size`); otherwise one is built from `config`.
    Only one engine may drive a runner at a time. `proposer` overrides the draft proposer that
    `config.speculative` names (tests and benchmarks bring their own).
    """

    def __init__(self, config: EngineConfig, runner: ModelRunner | None = None, proposer: Proposer | None = None) -> None:
        self.config = config
        self.runner = runner if runner is not None else ModelRunner(config)
        _check_runner_fits(self.runner, config)
        self.tokenizer = self.runner.tokenizer
        self.model_name = self.runner.model_name
        model_config = self.runner.model_config
        self.vocab_size = model_config.vocab_size
        self.eos_token_ids = set(self.tokenizer.eos_token_ids)
        self.max_model_len = min(config.max_model_len or model_config.max_position_embeddings,
                                 model_config.max_position_embeddings)
        self.kv_events = KVEventLog()
        self.kv_io = KVBlockIO(self.runner.kv_caches)
        host_tier = None
        if config.host_tier_blocks:
            dtype = getattr(torch, config.host_tier_dtype) if config.host_tier_dtype else None
            host_tier = HostTier(self.kv_io, config.host_tier_blocks, dtype)
        self.block_manager = BlockManager(config.num_kv_blocks, config.block_size, self.kv_events, host_tier)
        self.scheduler = Scheduler(config, self.block_manager)
        self.pins = KVPins(self.block_manager)
        self.pin_on_finish: set[str] = set()  # request ids whose blocks are pinned if they stop at "length"
        self.grammars = GrammarCache(lambda: LLGuidanceBackend(self.tokenizer, self.vocab_size))
        self.sampler = Sampler()
        if proposer is None:
            proposer = build_proposer(config, self.runner)
        self.speculator = Speculator(config, proposer, self.sampler, self.max_model_len, self.vocab_size)
        lora_dir = None if config.lora_dir is None else Path(config.lora_dir)
        self.adapters = ResidentAdapters(self.runner.lora_slots, model_config, lora_dir, config.max_lora_rank)
        self.seqs: dict[str, Sequence] = {}
        self.streams: dict[str, TextStream] = {}
        self.num_generated_tokens = 0

    # ---- requests --------------------------------------------------------------------------

    def validate(self, request: GenerationRequest) -> None:
        """Raise a typed error if `request` can never be served. Reads only fixed config."""
        prompt, max_tokens = request.prompt_token_ids, request.sampling.max_tokens
        if not prompt:
            raise InvalidRequest("the prompt is empty: send at least one token")
        for token_id in prompt:
            if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
                raise InvalidRequest(f"token id {token_id!r} is outside the vocabulary [0, {self.vocab_size})")
        if len(prompt) >= self.max_model_len:
            raise InvalidRequest(
                f"the prompt has {len(prompt)} tokens but the context holds {self.max_model_len}: shorten it"
            )
        if len(prompt) + max_tokens > self.max_model_len:
            raise InvalidRequest(
                f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the context of "
                f"{self.max_model_len} tokens: set max_tokens <= {self.max_model_len - len(prompt)}"
            )
        num_blocks = self.block_manager.num_blocks_for(len(prompt) + max_tokens)
        if num_blocks > self.block_manager.num_blocks:
            raise EngineOverloaded(
                f"prompt + max_tokens needs {num_blocks} KV blocks but this engine has "
                f"{self.block_manager.num_blocks}: lower max_tokens or use a larger backend"
            )

    def add_request(self, request: GenerationRequest) -> None:
        self.validate(request)
        if request.request_id in self.seqs:
            raise InvalidRequest(f"request id {request.request_id!r} is already in use")
        if len(self.scheduler.waiting) >= self.config.max_waiting:
            raise EngineOverloaded(f"{len(self.scheduler.waiting)} requests are already waiting: retry later")
        salt = adapter_salt(request.cache_salt, request.lora)
        seq = Sequence(request.request_id, list(request.prompt_token_ids), request.sampling, salt)
        if request.lora is not None:
            seq.lora_slot = self.adapters.acquire(request.lora)
        if request.sampling.guide is not None:
            seq.matcher = self.grammars.matcher(request.sampling.guide)  # compiled already by AsyncEngine
        self.seqs[seq.request_id] = seq
        self.streams[seq.request_id] = TextStream(self.tokenizer, seq.token_ids, request.sampling.stop)
        if request.pin_kv_on_finish:
            self.pin_on_finish.add(seq.request_id)
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> GenerationOutput | None:
        """Stop a request now and free its blocks; returns its final output, None if unknown."""
        seq = self.seqs.get(request_id)
        if seq is None:
            return None
        return self._finish(seq, "abort", [], "")

    def abort_all(self) -> list[GenerationOutput]:
        return [self._finish(seq, "abort", [], "") for seq in list(self.seqs.values())]

    @property
    def has_unfinished(self) -> bool:
        return bool(self.seqs)

    # ---- the step --------------------------------------------------------------------------

    def step(self) -> list[GenerationOutput]:
        started = self.speculator.clock()
        chunks = self.scheduler.schedule()
        if not chunks:
            return []
        items = [self.prepare_item(chunk) for chunk in chunks]
        run = self.runner.run(items, self.speculator.aux_layers)  # logits: [sum of 1 + drafts, V]
        rows = self.scheduler.update(chunks)  # chunks that reached the end of their sequence
        new_tokens = self.speculator.sample(run.logits, chunks, rows)
        outputs = [self.commit(chunks[i], token_ids) for i, token_ids in zip(rows, new_tokens)]
        # the whole step up to here (scheduling, the forward pass, verification, detokenising) is what a
        # stream waits for per step; the proposer's time is measured on its own
        self.speculator.observe_step(items, self.speculator.clock() - started)
        self.speculator.propose(chunks, items, run.hidden, len(self.scheduler.running))
        return outputs

    def prepare_item(self, chunk: ScheduledChunk) -> ForwardItem:
        token_ids = chunk.token_ids  # with the drafts to verify, if any
        end = chunk.start_pos + len(token_ids)
        blocks = chunk.seq.block_table[: self.block_manager.num_blocks_for(end)]
        return ForwardItem(token_ids, chunk.start_pos, blocks, 1 + len(chunk.draft_token_ids), chunk.seq.lora_slot)

    def commit(self, chunk: ScheduledChunk, token_ids: list[int]) -> GenerationOutput:
        """Append the step's new tokens (accepted drafts + one of the target's) to the sequence."""
        output = self.postprocess(chunk.seq, token_ids)
        if chunk.draft_token_ids and not output.is_finished:
            self.scheduler.accept_drafts(chunk.seq, len(token_ids) - 1)
        return output

    def postprocess(self, seq: Sequence, token_ids: list[int]) -> GenerationOutput:
        """Append tokens one by one until one ends the request (EOS, stop string, length)."""
        stream = self.streams[seq.request_id]
        text = ""
        for n, token_id in enumerate(token_ids, 1):
            seq.token_ids.append(token_id)
            self.num_generated_tokens += 1
            is_eos = token_id in self.eos_token_ids and not seq.sampling.ignore_eos
            piece, hit_stop = ("", False) if is_eos else stream.add(token_id)
            text += piece
            reason: FinishReason | None = None
            if seq.matcher is not None and not is_eos:
                # a token the mask allowed always fits; the grammar ends the answer once it is complete
                is_eos = not seq.matcher.accept(token_id) or seq.matcher.is_terminated()
            if hit_stop or is_eos:
                reason = "stop"
            elif seq.num_generated_tokens >= seq.sampling.max_tokens or len(seq) >= self.max_model_len:
                reason = "length"
            if reason is not None:
                if not hit_stop:
                    text += stream.finish()
                return self._finish(seq, reason, token_ids[:n], text)
        return self._output(seq, token_ids, text, None)

    def _finish(self, seq: Sequence, reason: FinishReason, new_token_ids: list[int], text: str) -> GenerationOutput:
        pin = None
        if seq.request_id in self.pin_on_finish:
            self.pin_on_finish.discard(seq.request_id)
            if reason == "length":  # a context step that stopped at its budget: keep its KV for a decode backend
                pin = self.pins.pin(seq)
        self.scheduler.finish(seq, reason)
        self.speculator.finish(seq)
        if seq.lora_slot is not None:
            self.adapters.release(seq.lora_slot)
        del self.seqs[seq.request_id]
        del self.streams[seq.request_id]
        output = self._output(seq, new_token_ids, text, reason)
        output.kv_pin = pin
        return output

    def _output(self, seq: Sequence, new_token_ids: list[int], text: str, reason: FinishReason | None) -> GenerationOutput:
        return GenerationOutput(
            request_id=seq.request_id,
            new_token_ids=new_token_ids,
            new_text=text,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_cached_tokens=seq.num_cached_tokens or 0,
            num_generated_tokens=seq.num_generated_tokens,
            finish_reason=reason,
            num_draft_tokens=seq.num_draft_tokens,
            num_accepted_draft_tokens=seq.num_accepted_tokens,
            num_verify_steps=seq.num_verify_steps,
        )

    # ---- introspection ---------------------------------------------------------------------

    def stats(self) -> EngineStats:
        s = self.scheduler
        return EngineStats(
            num_running=len(s.running),
            num_waiting=len(s.waiting) + len(s.imported),
            num_prefill_tokens=s.num_prefill_tokens(),
            num_decode_tokens=s.num_decode_tokens(),
            num_kv_blocks_total=self.block_manager.num_blocks,
            num_kv_blocks_free=self.block_manager.num_free_blocks,
            num_prefix_hit_tokens=s.num_prefix_hit_tokens,
            num_prompt_tokens=s.num_prompt_tokens,
            num_generated_tokens=self.num_generated_tokens,
            num_preemptions=s.num_preemptions,
            num_draft_tokens=self.speculator.num_draft_tokens,
            num_accepted_draft_tokens=self.speculator.num_accepted_tokens,
            num_kv_blocks_pinned=self.pins.num_pinned_blocks,
            host_tier=None if self.block_manager.host_tier is None else self.block_manager.host_tier.snapshot(),
            resident_adapters=tuple(self.adapters.names),
        )

    def drain_kv_events(self) -> list[KVCacheEvent]:
        return self.kv_events.drain()


def _check_runner_fits(runner: ModelRunner, config: EngineConfig) -> None:
    runner_config = runner.config
    if runner_config.block_size != config.block_size:
        raise ValueError(f"block_size {config.block_size} differs from the runner's {runner_config.block_size}")
    if config.num_kv_blocks > runner_config.num_kv_blocks:
        raise ValueError(
            f"num_kv_blocks {config.num_kv_blocks} exceeds the {runner_config.num_kv_blocks} the runner allocated"
        )
