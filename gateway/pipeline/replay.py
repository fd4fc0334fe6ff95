"""A cached answer played back the way a live `Generation` is read, so one renderer serves both.

`CachedAnswer` is what the response cache keeps of a completed generation: its text deltas in the
order the backend sent them, its finish reason and its usage. That is the answer itself, not its
encoding: a stream replays as the same sequence of events (one per delta, as the original was
written) in whichever format the request asks (Workers AI SSE, OpenAI chunks, or a whole JSON
body), under the new request's own id, `created` time and SSE padding. Tool calls and JSON mode are
cut from the text by the renderer, as they were the first time. The usage is the original answer's
(what the client reads is the answer as it was); the ledger bills the hit nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Protocol

from contracts.usage import Usage
from gateway.context import RequestContext

FORMAT_VERSION = 1


class Answer(Protocol):
    """What rendering reads of an answer: a live `Generation` or a `Replay`."""

    ctx: RequestContext
    created: int
    finish_reason: str | None
    usage: Usage | None  # set once the text is over

    def text_batches(self) -> AsyncGenerator[list[str], None]: ...

    async def collect(self) -> str: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class CachedAnswer:
    deltas: tuple[str, ...]
    finish_reason: str | None
    usage: Usage

    def to_json(self) -> str:
        u = self.usage
        return json.dumps(
            {"v": FORMAT_VERSION, "deltas": self.deltas, "finish_reason": self.finish_reason,
             "usage": [u.prompt_tokens, u.completion_tokens, u.cached_tokens]},
            separators=(",", ":"), ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str) -> CachedAnswer | None:
        """The answer, or None for an entry this version does not read (another format, damage)."""
        try:
            found: Any = json.loads(text)
            if found.get("v") != FORMAT_VERSION:
                return None
            deltas = found["deltas"]
            if not isinstance(deltas, list) or not all(isinstance(d, str) for d in deltas):
                return None
            finish_reason = found["finish_reason"]
            if finish_reason is not None and not isinstance(finish_reason, str):
                return None
            return cls(tuple(deltas), finish_reason, Usage(*found["usage"]))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


class Replay:
    """A `CachedAnswer` for one request: iterate `text_batches()` once (or call `collect()`)."""

    def __init__(self, ctx: RequestContext, answer: CachedAnswer) -> None:
        self.ctx = ctx
        self.created = int(time.time())
        self.finish_reason = answer.finish_reason
        self.usage: Usage | None = answer.usage
        self._deltas = answer.deltas

    async def text_batches(self) -> AsyncGenerator[list[str], None]:
        if self._deltas:
            yield list(self._deltas)

    async def collect(self) -> str:
        return "".join(self._deltas)

    async def aclose(self) -> None:
        """Nothing to settle: the hit's ledger record was written when it was found."""
