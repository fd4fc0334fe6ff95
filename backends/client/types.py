"""The plain data the client hands to its callers, and how it is read off the OpenAI wire shape."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backends.client.kinds import DEFAULT_KIND, BackendKind, kind_of
from contracts.usage import Usage


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One backend server: ours, trtllm-serve, vLLM or SGLang (anything speaking /v1/completions)."""

    id: str
    base_url: str  # e.g. "http://10.0.0.5:8100", no trailing path
    region: str
    role: str = "mixed"  # "mixed", "prefill" (context servers) or "decode" (generation servers)
    kind: str = DEFAULT_KIND  # the server's kind (backends.client.kinds): how requests are shaped for it
    return_token_ids: bool | None = None  # ask for each chunk's token ids; None: the kind's default
    # the finetunes directory as this server reads it (a kind that `loads_adapters`): adapter X is `<lora_dir>/X`
    lora_dir: str | None = None

    def url(self, path: str) -> str:
        return self.base_url.rstrip("/") + path

    @property
    def server(self) -> BackendKind:
        return kind_of(self.kind)

    def shape(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` as this endpoint's kind of server takes it (`BackendKind.shape`)."""
        server = self.server
        ask_ids = server.returns_token_ids if self.return_token_ids is None else self.return_token_ids
        return server.shape(body, return_token_ids=ask_ids)


class CompletionChunk:
    """One streamed event: new text (maybe empty), the new token ids when the backend sends them,
    the finish reason on the last text chunk, and the usage on the final usage-only chunk (and,
    with continuous usage stats, the usage so far on every chunk).

    A chunk read off the wire keeps its usage as the backend's JSON until `usage` is first read:
    a backend sends it with every chunk, and the gateway reads only the last one of each read."""

    __slots__ = ("text", "token_ids", "finish_reason", "_usage", "_usage_json", "_reports_cached")

    def __init__(
        self,
        text: str,
        token_ids: list[int] | None,
        finish_reason: str | None,
        usage: Usage | None,
        usage_json: dict[str, Any] | None = None,
    ) -> None:
        self.text = text
        self.token_ids = token_ids
        self.finish_reason = finish_reason
        self._usage = usage
        self._usage_json = usage_json if usage is None else None  # OpenAI's usage object, not decoded yet
        self._reports_cached = True  # a Usage given as such is complete

    @property
    def usage(self) -> Usage | None:
        if self._usage_json is not None:
            self._reports_cached = _has_cached_tokens(self._usage_json)
            self._usage, self._usage_json = Usage.from_json(self._usage_json), None
        return self._usage

    @usage.setter
    def usage(self, usage: Usage | None) -> None:
        self._usage, self._usage_json, self._reports_cached = usage, None, True

    @property
    def reports_cached_tokens(self) -> bool:
        """Whether this chunk's usage says how many prompt tokens were cached
        (`prompt_tokens_details.cached_tokens`): vLLM leaves it out unless started with
        --enable-prompt-tokens-details, and `Usage` then reads 0."""
        if self._usage_json is not None:
            return _has_cached_tokens(self._usage_json)
        return self._reports_cached

    @property
    def has_usage(self) -> bool:
        """Whether `usage` is set, without decoding it."""
        return self._usage is not None or self._usage_json is not None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompletionChunk):
            return NotImplemented
        return (self.text, self.token_ids, self.finish_reason, self.usage) == (
            other.text, other.token_ids, other.finish_reason, other.usage
        )

    def __repr__(self) -> str:
        return (
            f"CompletionChunk(text={self.text!r}, token_ids={self.token_ids!r}, "
            f"finish_reason={self.finish_reason!r}, usage={self.usage!r})"
        )

    @classmethod
    def from_json(cls, event: dict[str, Any]) -> CompletionChunk:
        """Read one `text_completion` (or `chat.completion.chunk`) SSE payload."""
        choices = event.get("choices") or []
        usage = event.get("usage")
        if not isinstance(usage, dict) or not usage:  # null, or not an object: no report
            usage = None
        if not choices:
            return cls("", None, None, None, usage)
        choice = choices[0]
        text = choice.get("text")
        if text is None:  # chat chunks carry the text in delta.content
            text = (choice.get("delta") or {}).get("content") or ""
        token_ids = choice.get("token_ids")
        return cls(text, list(token_ids) if token_ids is not None else None, choice.get("finish_reason"), None, usage)


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


def _has_cached_tokens(usage: dict[str, Any]) -> bool:
    details = usage.get("prompt_tokens_details")
    return isinstance(details, dict) and details.get("cached_tokens") is not None
