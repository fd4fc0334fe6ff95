"""Reading Workers AI answers as a client does: SSE events as they arrive, usage, errors by code.

Both load generators (Locust users, which read bytes with `requests`, and the benchmark, which
reads them with httpx) feed raw bytes into an `SSEDecoder` and the decoded `data:` payloads into
a `StreamTrace`, which stamps each chunk with the time it arrived. From those stamps:

- TTFT: request sent -> first text chunk;
- ITL: the gaps between consecutive text chunks (the gateway sends one chunk per backend chunk);
- TPOT: (end-to-end - TTFT) / (completion tokens - 1), the per-token decode time.

A stream that breaks after it started ends with `{"response": "", "errors": [...]}` and no
`[DONE]`; a refused request is a JSON error envelope with an HTTP error status. Both become a
`WorkersAIError` carrying the Workers AI code (e.g. 3040 out of capacity).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MODEL_ID = "@cf/huggingface/smollm2-135m-instruct"


def run_path(account_id: str, model: str = MODEL_ID) -> str:
    return f"/client/v4/accounts/{account_id}/ai/run/{model}"


class WorkersAIError(Exception):
    """An error the gateway answered with, by Workers AI code (or the HTTP status if it sent none)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def error_from_body(status: int, body: bytes) -> WorkersAIError:
    """The first error of a Cloudflare envelope, or one named after the HTTP status."""
    try:
        errors = json.loads(body).get("errors") or []
        first = errors[0]
        return WorkersAIError(int(first["code"]), str(first.get("message", "")))
    except (ValueError, AttributeError, IndexError, KeyError, TypeError):
        return WorkersAIError(status, f"HTTP {status}: {body[:200].decode(errors='replace')}")


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @classmethod
    def from_dict(cls, usage: dict[str, Any]) -> Usage:
        details = usage.get("prompt_tokens_details") or {}
        return cls(int(usage["prompt_tokens"]), int(usage["completion_tokens"]), int(details.get("cached_tokens", 0)))


class SSEDecoder:
    """Bytes in (any chunking), the payloads of complete `data:` events out."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[str]:
        self._buffer += chunk.replace(b"\r\n", b"\n")
        *events, self._buffer = self._buffer.split(b"\n\n")
        payloads = []
        for event in events:
            data = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
            if data:
                payloads.append(b"\n".join(data).decode())
        return payloads


@dataclass(slots=True)
class StreamTrace:
    """One streamed answer: chunk arrival times (perf_counter seconds), text, usage, outcome."""

    sent_at: float
    chunk_times: list[float] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    usage: Usage | None = None
    error: WorkersAIError | None = None
    done: bool = False
    finished_at: float | None = None

    def on_payload(self, payload: str, now: float) -> None:
        """Take one decoded `data:` payload that arrived at `now`."""
        if payload == "[DONE]":
            self.done = True
            self.finished_at = now
            return
        event = json.loads(payload)
        if event.get("errors"):
            first = event["errors"][0]
            self.error = WorkersAIError(int(first.get("code", 0)), str(first.get("message", "")))
            self.finished_at = now
        elif event.get("usage") is not None:
            self.usage = Usage.from_dict(event["usage"])
        else:
            self.chunk_times.append(now)
            self.pieces.append(str(event.get("response", "")))

    def finish(self, now: float) -> None:
        """The body ended: a stream without usage and [DONE] (and no error event) was cut short."""
        if self.finished_at is None:
            self.finished_at = now
        if self.error is None and (not self.done or self.usage is None):
            self.error = WorkersAIError(0, "the stream ended before its usage event and [DONE]")

    @property
    def ok(self) -> bool:
        return self.error is None and self.done and self.usage is not None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] - self.sent_at if self.chunk_times else None

    @property
    def itls_s(self) -> list[float]:
        times = self.chunk_times
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.sent_at

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first; None with fewer than two tokens."""
        if self.usage is None or self.usage.completion_tokens < 2 or self.ttft_s is None or self.e2e_s is None:
            return None
        return (self.e2e_s - self.ttft_s) / (self.usage.completion_tokens - 1)
