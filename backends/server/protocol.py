"""The OpenAI-compatible request bodies the backend accepts (the fields trtllm-serve and vLLM take).

Pydantic validates types and ranges; anything it rejects becomes a 400 in OpenAI's error shape
(see errors.py). Unknown fields are refused rather than silently ignored, so a caller learns at
once that a feature (logprobs, tools, ...) is not served here.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, field_validator

from engines.errors import InvalidRequest
from engines.guided import Guide
from engines.sampling_params import SamplingParams, knobs_of

TokenId = Annotated[StrictInt, Field(ge=0)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False
    # vLLM's extension: with include_usage, every chunk also carries the usage so far (a proxy that
    # loses the stream midway still knows the prompt's cached tokens and what was generated)
    continuous_usage_stats: StrictBool = False


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: StrictStr
    name: StrictStr | None = None


class DisaggregatedParams(BaseModel):
    """trtllm-serve's `disaggregated_params` (openai_protocol.py). Fields newer trtllm versions add
    (schedule_style, conversation_id, ctx_usage, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    request_type: Literal["context_only", "generation_only", "context_and_generation"]
    first_gen_tokens: list[TokenId] | None = None
    ctx_request_id: StrictInt | None = None
    encoded_opaque_state: StrictStr | None = None
    draft_tokens: list[TokenId] | None = None
    disagg_request_id: StrictInt | None = None

    @field_validator("request_type", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


class StructuralTag(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    begin: StrictStr
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    end: StrictStr


class ResponseFormat(BaseModel):
    """trtllm-serve's `response_format` (its openai_protocol.py), which also reads OpenAI's and
    vLLM's shapes: `json_object`; `json_schema` with `json_schema` either OpenAI's
    `{name, schema, strict}` wrapper or the bare schema; trtllm's `json` with `schema`; and the
    structural tag `{structures: [{begin, schema, end}], triggers}`. Regex and EBNF grammars are
    not served by the built-in engine."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json", "json_object", "json_schema", "structural_tag"]
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    json_schema: dict[str, Any] | None = None
    structures: list[StructuralTag] | None = None
    triggers: list[StrictStr] | None = None

    def guide(self) -> Guide | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return Guide("json_object")
        if self.type == "structural_tag":
            if not self.structures or not self.triggers:
                raise InvalidRequest("a structural_tag response_format needs structures and triggers")
            items = [{"begin": s.begin, "schema": s.schema_ or {}, "end": s.end} for s in self.structures]
            return Guide.structural_tag(items, self.triggers)
        schema = self.schema_ if self.type == "json" else self.json_schema
        if schema is None:
            raise InvalidRequest(f"a {self.type} response_format needs its schema")
        if "schema" in schema and set(schema) <= {"name", "description", "schema", "strict"}:
            schema = schema["schema"]  # OpenAI's wrapper
        return Guide.json_schema(schema)


class SamplingFields(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[StrictFloat, Field(ge=0.0, le=5.0)] = 1.0
    top_p: Annotated[StrictFloat, Field(gt=0.0, le=1.0)] = 1.0
    top_k: StrictInt | None = None  # None, 0 or -1: no top-k filter
    seed: StrictInt | None = None
    repetition_penalty: Annotated[StrictFloat, Field(gt=0.0, le=2.0)] = 1.0
    frequency_penalty: Annotated[StrictFloat, Field(ge=-2.0, le=2.0)] = 0.0
    presence_penalty: Annotated[StrictFloat, Field(ge=-2.0, le=2.0)] = 0.0
    stop: StrictStr | list[StrictStr] | None = None
    ignore_eos: StrictBool = False
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1)] = 1
    user: StrictStr | None = None
    cache_salt: StrictStr | None = None
    disaggregated_params: DisaggregatedParams | None = None
    return_token_ids: StrictBool = False  # vLLM's extension: each choice also carries its token ids
    logprobs: Any = None
    response_format: ResponseFormat | None = None  # guided decoding (trtllm-serve, vLLM, SGLang)
    guided_json: dict[str, Any] | StrictStr | None = None  # vLLM's older field: a JSON schema

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError(f"n={n} is not supported: this backend returns one choice per request; send {n} requests")
        return n

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, logprobs: Any) -> Any:
        if logprobs not in (None, False, 0):
            raise ValueError("logprobs are not supported by this backend")
        return None

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, top_k: int | None) -> int | None:
        if top_k is not None and top_k < -1:
            raise ValueError("top_k must be >= 1, or 0 / -1 / absent for no top-k filter")
        return top_k if top_k is not None and top_k >= 1 else None

    @field_validator("stop")
    @classmethod
    def _stop(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        if len(stops) > 16:
            raise ValueError("at most 16 stop strings are supported")
        return stop

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        return self.stream_options is not None and self.include_usage and self.stream_options.continuous_usage_stats

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """Engine sampling parameters (raises engines.errors.InvalidRequest on a bad combination)."""
        return SamplingParams(
            max_tokens=max_tokens,
            **knobs_of(self),
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            ignore_eos=self.ignore_eos,
            guide=self.guide(),
        )

    def guide(self) -> Guide | None:
        if self.guided_json is not None:
            try:
                schema = json.loads(self.guided_json) if isinstance(self.guided_json, str) else self.guided_json
            except ValueError as exc:
                raise InvalidRequest(f"guided_json is not valid JSON: {exc}") from exc
            return Guide.json_schema(schema)
        return self.response_format.guide() if self.response_format is not None else None


class CompletionRequest(SamplingFields):
    """POST /v1/completions. `prompt` is text, token ids, or a one-element list of either."""

    prompt: StrictStr | list[TokenId] | list[StrictStr] | list[list[TokenId]]
    echo: StrictBool = False
    suffix: StrictStr | None = None

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ValueError(f"{len(prompt)} prompts in one request are not supported: send one request per prompt")
            prompt = prompt[0]
        if not prompt:
            raise ValueError("the prompt is empty")
        return prompt

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool) -> bool:
        if echo:
            raise ValueError("echo is not supported by this backend")
        return echo

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, suffix: str | None) -> str | None:
        if suffix:
            raise ValueError("suffix is not supported by this backend")
        return suffix


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions: messages go through the model's chat template."""

    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    add_generation_prompt: StrictBool = True
    # trtllm-serve's generation step of a chat request: the context step's prompt_token_ids
    prompt_token_ids: list[TokenId] | None = None

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in self.messages]
