"""Server-sent event encoding for the two streaming dialects the gateway speaks.

Workers AI:  `data: {"response": "<text>", "p": "<padding>"}` per chunk, then
             `data: {"response": "", "usage": {...}}`, then `data: [DONE]`; an answer
             with tool calls sends `data: {"response": "", "tool_calls": [...]}` before the usage.
             The random-length `p` field hides token lengths from anyone watching encrypted
             traffic sizes (the side channel Workers AI pads against).
OpenAI:      `chat.completion.chunk` / `text_completion` objects, the first chat chunk carrying
             the assistant role, a last chunk with `finish_reason`, and with
             `stream_options.include_usage` one more chunk whose `choices` is empty and whose
             `usage` is filled (every other chunk then has `usage: null`); then `data: [DONE]`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from contracts.openai_error import error_body
from contracts.sse import event
from contracts.usage import Usage
from gateway.errors import GatewayError

MAX_PADDING_CHARS = 32  # even: the padding is hex
_PADDING_BYTES = MAX_PADDING_CHARS // 2 + 1  # the digits, then one byte for the length
_PADDINGS_PER_READ = 8


class PaddingSource:
    """Random paddings for one stream, from the OS's generator (unpredictable to an observer),
    read 8 paddings' worth at a time: one system call per 8 chunks, no generator to seed."""

    __slots__ = ("_at", "_pool")

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def __call__(self) -> str:
        at = self._at
        if at + _PADDING_BYTES > len(self._pool):
            self._pool, at = os.urandom(_PADDING_BYTES * _PADDINGS_PER_READ), 0
        self._at = at + _PADDING_BYTES
        length = self._pool[at + _PADDING_BYTES - 1] % MAX_PADDING_CHARS + 1  # 256 % 32 == 0: uniform
        return self._pool[at : at + _PADDING_BYTES - 1].hex()[:length]


def padding_source() -> PaddingSource:
    """One source per stream."""
    return PaddingSource()


def padding(rng: PaddingSource) -> str:
    """A random string (hex digits) of random length (1..MAX_PADDING_CHARS characters)."""
    return rng()


# ---- Workers AI -------------------------------------------------------------------------------


def workers_ai_chunk(text: str, rng: PaddingSource) -> bytes:
    """`event({"response": text, "p": padding})`, byte for byte, written out by hand: this runs for
    every chunk of every stream (the padding is hex: nothing in it to escape)."""
    return ('data: {"response":' + encode_basestring(text) + ',"p":"' + rng() + '"}\n\n').encode()


def workers_ai_tool_calls(tool_calls: list[dict[str, Any]]) -> bytes:
    """The calls of a streamed answer, sent once before the usage event."""
    return event({"response": "", "tool_calls": tool_calls})


def workers_ai_usage(usage: Usage) -> bytes:
    return event({"response": "", "usage": usage.as_dict()})


def workers_ai_error(error: GatewayError) -> bytes:
    """Sent instead of the usage event when a stream breaks after it started (no [DONE] follows)."""
    return event({"response": "", "errors": [{"code": error.code, "message": error.message}]})


# ---- OpenAI -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenAIStream:
    """The fixed fields of one OpenAI stream: each method returns one encoded event."""

    completion_id: str
    created: int
    model: str
    chat: bool  # chat.completion.chunk (delta) or text_completion (text)
    include_usage: bool

    def _chunk(self, choices: list[dict[str, Any]], usage: Usage | None = None) -> bytes:
        payload: dict[str, Any] = {
            "id": self.completion_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            payload["usage"] = usage.as_dict() if usage is not None else None
        return event(payload)

    def _choice(self, text: str | None, finish_reason: str | None, role: bool = False) -> dict[str, Any]:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def first(self) -> bytes | None:
        """The chat stream opens with the assistant role and empty content; completions don't."""
        return self._chunk([self._choice("", None, role=True)]) if self.chat else None

    def text(self, text: str) -> bytes:
        return self._chunk([self._choice(text, None)])

    def tool_calls(self, calls: list[dict[str, Any]]) -> bytes:
        """One delta carrying whole calls (OpenAI's delta shape: `index`, `id`, `type`, `function`
        with `name` and the `arguments` string), which clients concatenate as they would pieces."""
        return self._chunk([{"index": 0, "delta": {"tool_calls": calls}, "logprobs": None, "finish_reason": None}])

    def finish(self, finish_reason: str | None) -> bytes:
        return self._chunk([self._choice(None if self.chat else "", finish_reason or "stop")])

    def usage(self, usage: Usage) -> bytes | None:
        return self._chunk([], usage) if self.include_usage else None

    @staticmethod
    def error(error: GatewayError) -> bytes:
        return event(error_body(error.message, error.openai_type, str(error.code)))
