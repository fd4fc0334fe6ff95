"""The one `Usage`: a request's token counts, from a backend's last chunk to the ledger record.

Backends report it in OpenAI's shape (`from_json`), the gateway answers with it (`as_dict`),
metering prices it and the ledger stores its fields. `prompt_tokens` includes `cached_tokens`
(the prompt tokens served from a prefix cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class InvalidUsage(ValueError):
    """Counts that are not non-negative integers, or more cached tokens than prompt tokens."""


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidUsage(f"usage {name}={value!r} must be a non-negative integer")
        if self.cached_tokens > self.prompt_tokens:
            raise InvalidUsage(f"cached_tokens={self.cached_tokens} exceeds prompt_tokens={self.prompt_tokens}")

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def uncached_prompt_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
        )

    def as_dict(self) -> dict[str, Any]:
        """OpenAI's `usage` object, as every API the gateway speaks reports it."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    @classmethod
    def from_json(cls, usage: dict[str, Any]) -> Usage:
        """Read OpenAI's `usage` from a backend. `prompt_tokens_details` may be absent or null
        (then 0 cached); counts are clamped into range rather than refused, since a third-party
        server's odd report must not fail a request that already ran: a count that is no number
        at all (a word, NaN, an object) reads as 0."""
        details = usage.get("prompt_tokens_details")
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
        cached = min(prompt, _count(details.get("cached_tokens")) if isinstance(details, dict) else 0)
        # in range by construction: skip __post_init__'s checks (a backend sends usage with every chunk)
        found = object.__new__(cls)
        object.__setattr__(found, "prompt_tokens", prompt)
        object.__setattr__(found, "completion_tokens", completion)
        object.__setattr__(found, "cached_tokens", cached)
        return found


def _count(value: Any) -> int:
    """A backend's count as a non-negative int (see `Usage.from_json`)."""
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError, OverflowError):
        return 0
