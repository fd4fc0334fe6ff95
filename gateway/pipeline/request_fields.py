"""Which request fields the gateway honours, which it may safely ignore, and which it refuses.

No silent ignoring: a client that sends a field and gets an answer that ignored it has been lied
to. Every top-level field of a text-generation body is looked up in one table per API
below; a field the gateway does not honour is refused with a 400 naming it (Workers AI code 5004,
OpenAI `invalid_request_error` with `param`), unless its value is the one that changes nothing
(`functions: []`, `logit_bias: {}`). Unknown fields are
refused too (a misspelt `max_token` would otherwise run with 256 tokens).

A few fields are accepted and ignored, each with its reason: they never change the output (an
end-user id for the provider's abuse monitoring, tags for a dashboard edgerun does not have).

The official clients send only the fields their caller passes (the openai SDK drops unset
arguments, the cloudflare SDK too), so their defaults never meet a refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gateway.errors import InvalidInput


class Treatment(Enum):
    HONOURED = "honoured"  # parsed and acted on (gateway/pipeline/schemas.py)
    IGNORED = "ignored"  # accepted; it cannot change what the model answers
    REFUSED = "refused"  # not implemented: 400 unless the value is a no-op


@dataclass(frozen=True, slots=True)
class FieldRule:
    treatment: Treatment
    reason: str = ""
    no_ops: tuple[Any, ...] = ()  # values of a REFUSED field that ask for nothing and so pass

    def allows(self, value: Any) -> bool:
        return self.treatment is not Treatment.REFUSED or value is None or value in self.no_ops


HONOURED = FieldRule(Treatment.HONOURED)


def ignored(reason: str) -> FieldRule:
    return FieldRule(Treatment.IGNORED, reason)


def refused(reason: str, *no_ops: Any) -> FieldRule:
    return FieldRule(Treatment.REFUSED, reason, no_ops)


_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty")
_PENALTIES = ("frequency_penalty", "presence_penalty")
_NOT_YET = "is not supported yet: edgerun would answer free text and ignore it"
_LEGACY_FUNCTIONS = "is OpenAI's deprecated form of function calling: send tools (and tool_choice) instead"

WORKERS_AI: Mapping[str, FieldRule] = {
    **{name: HONOURED for name in ("prompt", "messages", "stream", "raw", *_SAMPLING, *_PENALTIES)},
    **{name: HONOURED for name in ("response_format", "guided_json", "tools", "tool_choice")},
    "functions": refused(_LEGACY_FUNCTIONS, []),
    "lora": refused("names a LoRA adapter; edgerun serves base models only"),
    "image": refused("is an image input; the served models read text only"),
}

_OPENAI_SHARED: Mapping[str, FieldRule] = {
    **{name: HONOURED for name in ("model", "stream", "stream_options", "stop", "n", "logprobs")},
    **{name: HONOURED for name in (*_SAMPLING, *_PENALTIES)},
    "user": ignored("an end-user id for the provider's abuse monitoring; it never changes the output"),
    "safety_identifier": ignored("the newer name of `user`: abuse monitoring only"),
    "metadata": ignored("tags for OpenAI's stored-completions dashboard; edgerun stores no completions"),
    "store": ignored("asks OpenAI to keep the completion for its dashboard; the answer does not depend on it"),
    "service_tier": ignored("OpenAI's capacity tier; edgerun has one"),
    "prompt_cache_key": ignored("a cache-routing hint; edgerun routes by prefix blocks and x-session-affinity"),
    "prompt_cache_retention": ignored("how long OpenAI keeps a prompt cache; edgerun's KV cache is bounded by memory"),
    "logit_bias": refused("is not supported: the backends take no per-token bias; leave it out", {}),
    "top_logprobs": refused("is not supported: edgerun returns no logprobs; leave it out", 0),
}

OPENAI_CHAT: Mapping[str, FieldRule] = {
    **_OPENAI_SHARED,
    "messages": HONOURED,
    "max_completion_tokens": HONOURED,
    **{name: HONOURED for name in ("response_format", "tools", "tool_choice", "parallel_tool_calls")},
    "functions": refused(_LEGACY_FUNCTIONS, []),
    "function_call": refused(_LEGACY_FUNCTIONS, "none"),
    "modalities": refused("asks for output other than text; the served models write text only", ["text"]),
    "audio": refused("asks for audio output; the served models write text only"),
    "prediction": refused("is not supported (no predicted-output decoding); leave it out"),
    "reasoning_effort": refused("applies to reasoning models; the served models do not reason"),
    "verbosity": refused("is not supported: the served models take no verbosity control; use max_tokens"),
    "web_search_options": refused("asks for web search; edgerun runs the model alone"),
}

OPENAI_COMPLETIONS: Mapping[str, FieldRule] = {
    **_OPENAI_SHARED,
    "prompt": HONOURED,
    "response_format": HONOURED,
    "echo": refused("is not supported: the answer never repeats the prompt", False),
    "suffix": refused("is not supported (no fill-in-the-middle); leave it out", ""),
    "best_of": refused("is not supported: one completion is generated per request", 1),
}


OPENAI_RESPONSES: Mapping[str, FieldRule] = {
    **{name: HONOURED for name in ("model", "input", "instructions", "max_output_tokens", "temperature", "top_p")},
    **{name: HONOURED for name in ("stream", "stream_options")},  # stream_options.include_obfuscation
    **{name: _OPENAI_SHARED[name] for name in ("user", "safety_identifier", "metadata", "service_tier",
                                               "prompt_cache_key", "prompt_cache_retention")},
    "store": ignored("asks OpenAI to keep the response for later retrieval; edgerun keeps none, and the answer "
                     "does not depend on it (previous_response_id is refused)"),
    **{name: HONOURED for name in ("tools", "tool_choice", "parallel_tool_calls")},  # function tools only
    "text": HONOURED,  # text.format: JSON mode (gateway/pipeline/structured.py)
    "previous_response_id": refused("is not supported: edgerun stores no responses; send the whole conversation "
                                    "as input items"),
    "conversation": refused("is not supported: edgerun stores no conversations; send the whole conversation as "
                            "input items"),
    "reasoning": refused("applies to reasoning models; the served models do not reason"),
    "include": refused("asks for extra output data (logprobs, encrypted reasoning) edgerun does not produce", []),
    "background": refused("is not supported: responses are answered while the request is open", False),
    "truncation": refused("auto is not supported: a conversation longer than the context is refused, never cut",
                          "disabled"),
    "max_tool_calls": refused("is not supported: the model's calls are returned, not run; leave it out"),
    "top_logprobs": refused("is not supported: edgerun returns no logprobs; leave it out", 0),
    "prompt": refused("names a stored prompt template; edgerun stores none: send the text as input"),
}


WORKERS_AI_EMBEDDINGS: Mapping[str, FieldRule] = {
    "text": HONOURED,
    "pooling": refused("is fixed by the model's checkpoint (mean for all-MiniLM-L6-v2); leave it out", "mean"),
}

OPENAI_EMBEDDINGS: Mapping[str, FieldRule] = {
    "model": HONOURED,
    "input": HONOURED,
    "encoding_format": HONOURED,  # "float" or "base64" (what the openai SDK asks for by default)
    "dimensions": refused("is not supported: vectors have the model's own size; leave it out"),
    "user": _OPENAI_SHARED["user"],
}


def check_fields(body: Mapping[str, Any], rules: Mapping[str, FieldRule], where: str) -> None:
    """Refuse the first field of `body` that `rules` does not let through (InvalidInput naming it)."""
    for name, value in body.items():
        rule = rules.get(name)
        if rule is None:
            known = ", ".join(sorted(n for n, r in rules.items() if r.treatment is not Treatment.REFUSED))
            raise InvalidInput(f"{name} is not a field of {where}: the fields are {known}", param=name)
        if not rule.allows(value):
            raise InvalidInput(f"{name} {rule.reason}", param=name)
