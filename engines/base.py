"""The interface every engine implements, as servers see it.

A backend server hosts exactly one `Engine`. It submits requests with `generate()`, which is an
async iterator of `GenerationOutput` deltas; breaking out of the iteration (or calling `abort`)
cancels the request and frees its KV blocks at once. The built-in PyTorch engine
(`engines.builtin.engine.async_engine.AsyncEngine`) and the TensorRT-LLM in-process adapter
(`engines.tensorrt_llm.adapter`) both implement it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal, Protocol

from engines.sampling_params import SamplingParams

FinishReason = Literal["stop", "length", "abort"]


@dataclass(slots=True)
class GenerationRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Tenant isolation of the prefix cache: only requests with the same salt share cached blocks.
    cache_salt: str | None = None
    # Disaggregated serving's context step: when the request stops at its token budget, its KV
    # blocks are pinned (not freed) for a decode backend to pull; the final output carries the pin.
    pin_kv_on_finish: bool = False
    # A LoRA adapter to run under (its name where the engine finds adapters); None: the base model.
    # Its prefix cache entries are its own (`contracts.prefix_hash.adapter_salt`).
    lora: str | None = None


@dataclass(slots=True)
class KVPin:
    """KV blocks kept after a context step: `block_ids` hold positions [0, num_tokens)."""

    pin_id: int
    block_ids: list[int]
    num_tokens: int


@dataclass(slots=True)
class GenerationOutput:
    """One step's news for one request: the tokens produced since the last output."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    num_generated_tokens: int  # total so far, including new_token_ids
    finish_reason: FinishReason | None = None
    # Speculative decoding, totals so far: drafts verified, drafts accepted, steps that verified drafts
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    num_verify_steps: int = 0
    kv_pin: KVPin | None = None  # set on the final output of a `pin_kv_on_finish` request that pinned

    @property
    def is_finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class EngineStats:
    """A cheap snapshot of load, for /metrics and the gateway's load polling."""

    num_running: int
    num_waiting: int
    num_prefill_tokens: int  # prompt tokens admitted but not yet prefilled
    num_decode_tokens: int  # tokens still to generate (max_tokens budget) for running requests
    num_kv_blocks_total: int
    num_kv_blocks_free: int
    num_prefix_hit_tokens: int  # cumulative prompt tokens served from the prefix cache
    num_prompt_tokens: int  # cumulative prompt tokens
    num_generated_tokens: int  # cumulative generated tokens
    num_preemptions: int = 0  # cumulative sequences preempted (KV blocks ran out) and recomputed
    num_draft_tokens: int = 0  # cumulative speculative drafts verified
    num_accepted_draft_tokens: int = 0  # cumulative drafts the target accepted
    num_kv_blocks_pinned: int = 0  # blocks held for decode backends to pull (disaggregated serving)
    host_tier: KVTierCounters | None = None  # the host-memory tier below the KV pool, where there is one
    resident_adapters: tuple[str, ...] = ()  # LoRA adapters loaded now, most recently used first


@dataclass(slots=True)
class KVTierCounters:
    """One KV tier below the pool: its size now and cumulative counts (blocks, bytes, seconds)."""

    capacity_blocks: int = 0
    num_blocks: int = 0  # held now
    num_hit_blocks: int = 0  # blocks a lookup found there (copied back instead of prefilled)
    num_miss_blocks: int = 0  # blocks past the pool's hits that it did not hold either
    num_stored_blocks: int = 0
    num_evicted_blocks: int = 0
    num_bytes_in: int = 0  # into the tier
    num_bytes_out: int = 0  # out of it, back into the pool (or to the region)
    seconds: float = 0.0  # spent copying


@dataclass(slots=True)
class KVCacheEvent:
    """TensorRT-LLM's KV event shape: blocks stored (with parent) or removed."""

    event_id: int
    kind: Literal["stored", "removed"]
    block_hashes: list[int]
    parent_hash: int | None = None
    token_ids: list[list[int]] | None = None  # per stored block, so a router can re-hash
    medium: str = "GPU"  # where the blocks are (were): contracts.kv_events.MEDIA


class Tokenizer(Protocol):
    eos_token_ids: set[int]

    def encode(self, text: str) -> list[int]: ...
    def decode(self, token_ids: list[int]) -> str: ...
    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str: ...
    # the prompt ids of a conversation; special-token strings in its messages are plain text
    def encode_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]: ...


class Engine(Protocol):
    model_name: str

    @property
    def tokenizer(self) -> Tokenizer: ...  # read-only here, so an engine may hold a narrower type

    max_model_len: int

    async def start(self) -> None: ...
    async def stop(self, timeout_s: float = 10.0) -> None: ...
    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]: ...
    async def abort(self, request_id: str) -> None: ...
    def stats(self) -> EngineStats: ...
    def drain_kv_events(self) -> list[KVCacheEvent]: ...
