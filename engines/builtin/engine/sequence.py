"""One request's state inside the engine: its tokens, KV blocks and progress."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from engines.base import FinishReason
from engines.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    IMPORTING = enum.auto()  # holds blocks whose KV is being pulled from another backend (kv_handoff)
    IMPORTED = enum.auto()  # its KV is in place; waits for a running slot (scheduler.add_imported)
    FINISHED = enum.auto()


@dataclass(slots=True, eq=False)
class Sequence:
    """A request as the scheduler sees it.

    `token_ids` is the prompt followed by every generated token. `num_computed_tokens` of them
    already have their keys and values in the KV cache (blocks listed in `block_table`); the rest
    are fed to the model in the next steps. After a preemption the blocks are gone, the count
    drops to zero and the whole sequence (generated tokens included) is prefilled again.
    """

    request_id: str
    token_ids: list[int]
    sampling: SamplingParams
    cache_salt: str | None = None  # the prefix cache's salt: the request's, with its adapter's name when it has one
    lora_slot: int | None = None  # the runner's slot of the LoRA adapter it runs under (engine/adapters.py)
    status: SequenceStatus = SequenceStatus.WAITING
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int | None = None  # prompt tokens from the prefix cache, set at first admission
    block_table: list[int] = field(default_factory=list)
    # Hashes of the full blocks at the head of block_table whose KV is computed, in chain order.
    block_hashes: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    generator: torch.Generator | None = None  # per-request RNG when sampling.seed is set
    matcher: Any = None  # grammar.backend.Matcher of a guided request: which tokens may come next
    # Speculative decoding: drafts proposed to follow token_ids, verified with the next decode.
    draft_token_ids: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0  # drafts verified so far
    num_accepted_tokens: int = 0  # of which accepted
    num_verify_steps: int = 0  # decode steps that verified drafts

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def generated_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        """More than the last sampled token still has to go through the model."""
        return self.num_uncomputed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def num_tokens_left(self) -> int:
        """Generation budget still open (max_tokens minus what was generated)."""
        return self.sampling.max_tokens - self.num_generated_tokens
