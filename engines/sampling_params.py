"""Sampling parameters shared by every engine (built-in and TensorRT-LLM adapter)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engines.errors import InvalidRequest
from engines.guided import Guide

# The knobs that keep their names from a request to the engine's own sampling parameters (the
# backend's request body, vLLM's and TensorRT-LLM's SamplingParams): copied by name, not listed again.
KNOBS = ("temperature", "top_p", "top_k", "seed", "repetition_penalty", "frequency_penalty", "presence_penalty")


@dataclass(slots=True)
class SamplingParams:
    """How to pick the next token and when to stop.

    `temperature == 0` means greedy. Ranges follow the Workers AI documentation where it
    gives one (temperature 0-5, top_p (0, 1], top_k >= 1, repetition_penalty (0, 2],
    frequency/presence penalty -2..2). `top_k=None` and `top_p=1.0` disable those filters.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    guide: Guide | None = None  # guided decoding: the output must match it (engines/guided.py)

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> InvalidRequest:
            return InvalidRequest(f"{name}={getattr(self, name)!r} is out of range: {rule}")

        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise bad("max_tokens", "must be an integer >= 1")
        if not 0.0 <= self.temperature <= 5.0:
            raise bad("temperature", "must be between 0 and 5")
        if not 0.0 < self.top_p <= 1.0:
            raise bad("top_p", "must be in (0, 1]")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise bad("top_k", "must be an integer >= 1, or absent")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise bad("repetition_penalty", "must be in (0, 2]")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise bad("frequency_penalty", "must be between -2 and 2")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise bad("presence_penalty", "must be between -2 and 2")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidRequest("stop must be a list of non-empty strings")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


def knobs_of(source: object) -> dict[str, Any]:
    """The KNOBS of anything that has them as attributes (a request, SamplingParams), by name."""
    return {name: getattr(source, name) for name in KNOBS}
