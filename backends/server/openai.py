"""OpenAI response shapes: whole answers, stream chunks and SSE framing, for both routes.

`Renderer` knows the request's id, model and kind ("completion" or "chat") and turns engine
outputs into the JSON objects OpenAI clients (and the edgerun gateway) expect.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from backends.server.generation import Completion
from contracts.openai_error import error_body
from contracts.usage import Usage
from engines.base import GenerationOutput

Kind = Literal["completion", "chat"]  # which OpenAI route the answer is for


@dataclass(slots=True)
class Renderer:
    request_id: str
    model: str
    kind: Kind
    return_token_ids: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    _sent_role: bool = False

    @property
    def object(self) -> str:
        return "text_completion" if self.kind == "completion" else "chat.completion"

    @property
    def chunk_object(self) -> str:
        return "text_completion" if self.kind == "completion" else "chat.completion.chunk"

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.request_id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def answer(self, completion: Completion) -> dict[str, Any]:
        """The whole non-streaming answer."""
        choice: dict[str, Any] = {"index": 0}
        if self.kind == "completion":
            choice["text"] = completion.text
        else:
            choice["message"] = {"role": "assistant", "content": completion.text}
        choice.update(logprobs=None, finish_reason=completion.finish_reason)
        if self.return_token_ids:
            choice["token_ids"] = completion.token_ids
        body = self._envelope(self.object, [choice])
        body["usage"] = Usage(
            completion.num_prompt_tokens, completion.num_generated_tokens, completion.num_cached_tokens
        ).as_dict()
        return body

    def chunk(self, output: GenerationOutput) -> dict[str, Any] | None:
        """The stream chunk for one engine output, or None when it carries nothing to send."""
        has_ids = self.return_token_ids and output.new_token_ids
        if not output.new_text and output.finish_reason is None and not has_ids and self._sent_role:
            return None
        choice: dict[str, Any] = {"index": 0}
        if self.kind == "completion":
            choice["text"] = output.new_text
        else:
            delta: dict[str, Any] = {} if self._sent_role else {"role": "assistant"}
            if output.new_text or not self._sent_role:
                delta["content"] = output.new_text
            choice["delta"] = delta
        self._sent_role = True
        choice.update(logprobs=None, finish_reason=output.finish_reason)
        if self.return_token_ids:
            choice["token_ids"] = list(output.new_token_ids)
        return self._envelope(self.chunk_object, [choice])

    def usage_chunk(self, last: GenerationOutput) -> dict[str, Any]:
        """The final `include_usage` chunk: no choices, only usage."""
        body = self._envelope(self.chunk_object, [])
        body["usage"] = self.usage_so_far(last)
        return body

    @staticmethod
    def usage_so_far(output: GenerationOutput) -> dict[str, Any]:
        """Usage up to and including `output` (`continuous_usage_stats` puts it on every chunk)."""
        return Usage(output.num_prompt_tokens, output.num_generated_tokens, output.num_cached_tokens).as_dict()

    def error_chunk(self, status: int, type_: str, message: str) -> dict[str, Any]:
        """An error after the stream began (the status line is already sent)."""
        return error_body(message, type_, status)
