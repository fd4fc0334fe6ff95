"""The plain data the client hands to its callers, and how it is read off the OpenAI wire shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.usage import Usage


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One backend server: ours, trtllm-serve, vLLM or SGLang (anything speaking /v1/completions)."""

    id: str
    base_url: str  # e.g. "http://10.0.0.5:8100", no trailing path
    region: str
    role: str = "mixed"  # "mixed", "prefill" (context servers) or "decode" (generation servers)

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path


@dataclass(slots=True)
class CompletionChunk:
    """One streamed event: new text (maybe empty), the new token ids when the backend sends them,
    the finish reason on the last text chunk, and the usage on the final usage-only chunk."""

    text: str
    token_ids: list[int] | None
    finish_reason: str | None
    usage: Usage | None

    @classmethod
    def from_json(cls, event: dict[str, Any]) -> CompletionChunk:
        """Read one `text_completion` (or `chat.completion.chunk`) SSE payload."""
        choices = event.get("choices") or []
        usage = event.get("usage")
        if not choices:
            return cls(text="", token_ids=None, finish_reason=None, usage=Usage.from_json(usage) if usage else None)
        choice = choices[0]
        text = choice.get("text")
        if text is None:  # chat chunks carry the text in delta.content
            text = (choice.get("delta") or {}).get("content") or ""
        token_ids = choice.get("token_ids")
        return cls(
            text=text,
            token_ids=list(token_ids) if token_ids is not None else None,
            finish_reason=choice.get("finish_reason"),
            usage=Usage.from_json(usage) if usage else None,
        )


@dataclass(slots=True)
class ContextAnswer:
    """A context step's answer (trtllm-serve's disaggregated protocol, `BackendClient.context`)."""

    text: str
    token_ids: list[int]  # the first generated token(s): disaggregated_params.first_gen_tokens
    finish_reason: str | None
    usage: Usage
    prompt_token_ids: list[int] | None
    disaggregated_params: dict[str, Any] | None  # None when the answer is already final

    def needs_generation(self, max_tokens: int) -> bool:
        """Whether a generation step must follow: trtllm-serve's rule (finish_reason "length" or
        "not_finished" with params), except that a one-token request is already complete."""
        pending = self.finish_reason in ("length", "not_finished") and self.disaggregated_params is not None
        return pending and max_tokens > len(self.token_ids)

    @classmethod
    def from_json(cls, answer: dict[str, Any]) -> ContextAnswer:
        choice = answer["choices"][0]
        text = choice.get("text")
        if text is None:
            text = (choice.get("message") or {}).get("content") or ""
        params = choice.get("disaggregated_params")
        first = (params or {}).get("first_gen_tokens") or choice.get("token_ids") or []
        prompt_ids = answer.get("prompt_token_ids")
        return cls(
            text=text,
            token_ids=[int(t) for t in first],
            finish_reason=choice.get("finish_reason"),
            usage=Usage.from_json(answer.get("usage") or {}),
            prompt_token_ids=[int(t) for t in prompt_ids] if prompt_ids is not None else None,
            disaggregated_params=dict(params) if isinstance(params, dict) else None,
        )
