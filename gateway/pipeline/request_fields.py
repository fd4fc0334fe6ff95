"""Which request fields the gateway honours, which it ignores, and which it refuses, route by route.

The rule (README "Request fields"), applied to every top-level field of a body and to the keys of
its `options` object:

1. A field whose value is null is absent (clients send `"stop": null` for "no stop strings").
2. A field the real API accepts is accepted: HONOURED, with its effect (gateway/pipeline/schemas.py),
   or IGNORED where it cannot change the answer (an end-user id for abuse monitoring, tags for a
   dashboard edgerun does not have), each with its reason.
3. A field that would change the answer and that edgerun cannot honour gets a 400 that names it
   and says what to send instead (Workers AI code 5004, OpenAI `invalid_request_error` with
   `param`), unless its value asks for nothing (`functions: []`, `logit_bias: {}`, `n: 1`). These
   are the route's own REFUSED fields and `GENERATION_REFUSED` / `EMBEDDINGS_REFUSED`: the
   answer-changing fields of the neighbouring APIs (OpenAI's on `/ai/run`, Workers AI's on
   `/ai/v1`, vLLM's and TGI's sampling extensions everywhere) that a client may send to a route
   that lacks them.
4. A name within a typo of a known field (`max_token`, `temprature`, `maxTokens`) gets a 400 with
   "did you mean"; it would otherwise run with the default. Any other unknown field is ignored, as
   Workers AI ignores it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gateway.errors import InvalidInput


class Treatment(Enum):
    HONOURED = "honoured"  # parsed and acted on (gateway/pipeline/schemas.py)
    IGNORED = "ignored"  # accepted; it cannot change what the model answers
    REFUSED = "refused"  # it would change the answer and is not implemented: 400 unless the value is a no-op


@dataclass(frozen=True, slots=True)
class FieldRule:
    treatment: Treatment
    reason: str = ""
    no_ops: tuple[Any, ...] = ()  # values of a REFUSED field that ask for nothing and so pass

    def allows(self, value: Any) -> bool:
        return self.treatment is not Treatment.REFUSED or value in self.no_ops


HONOURED = FieldRule(Treatment.HONOURED)


def ignored(reason: str) -> FieldRule:
    return FieldRule(Treatment.IGNORED, reason)


def refused(reason: str, *no_ops: Any) -> FieldRule:
    return FieldRule(Treatment.REFUSED, reason, no_ops)


_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "seed", "repetition_penalty")
_PENALTIES = ("frequency_penalty", "presence_penalty")
_LEGACY_FUNCTIONS = "is OpenAI's deprecated form of function calling: send tools (and tool_choice) instead"
_BATCH = ("asks for Workers AI's asynchronous batch API: POST {\"requests\": [...]} to /ai/run/{model}?queueRequest=true "
          "(gateway/pipeline/batch.py), or send each request on its own")
_SAMPLER = "is a sampler setting edgerun's backends do not take; leave it out"
_DECODING = "asks for constrained decoding edgerun does not offer: use response_format (json_object or json_schema)"
_TEMPLATE = "changes how the chat template is applied; edgerun applies the model's own template as it is"
OPTIONS_FIELD = "options"  # Workers AI's request options (rejectIfBusy), read with OPTIONS

# Answer-changing fields refused on every text-generation route whose own table does not list them.
GENERATION_REFUSED: Mapping[str, FieldRule] = {
    # other APIs' names for fields edgerun honours under another name
    "max_completion_tokens": refused("is OpenAI's chat name for max_tokens: send max_tokens on this route"),
    "max_output_tokens": refused("is the Responses API's name for max_tokens: send max_tokens on this route"),
    "max_new_tokens": refused("is Text Generation Inference's name: send max_tokens"),
    "stop_sequences": refused("is Anthropic's name: send stop"),
    "prompt": refused("is the input of /ai/run and /ai/v1/completions: send messages to chat completions"),
    "messages": refused("is the input of /ai/run and /ai/v1/chat/completions: send prompt (completions) or input "
                        "(responses) here"),
    "input": refused("is the Responses API's input: send messages (chat) or prompt (completions) here"),
    "instructions": refused("is the Responses API's system prompt: send a system message here"),
    "system": refused("is Anthropic's system prompt: send a system message in messages"),
    "response_format": refused("is chat's JSON mode: send text.format on /ai/v1/responses"),
    "tools": refused("function calling needs a chat request: send tools to /ai/v1/chat/completions or messages to "
                     "/ai/run", []),
    "tool_choice": refused("applies to tools, which need a chat request", "none"),
    "guided_json": refused("is Workers AI's JSON mode on /ai/run: send response_format here"),
    "raw": refused("applies to /ai/run prompts: send a raw prompt to /ai/v1/completions", False),
    "lora": refused("names a LoRA finetune on /ai/run; on /ai/v1 name it in model as \"<base model>:<finetune>\""),
    "image": refused("is an image input; the served models read text only"),
    "functions": refused(_LEGACY_FUNCTIONS, []),
    "function_call": refused(_LEGACY_FUNCTIONS, "none"),
    # OpenAI's, not implemented
    "n": refused("asks for several answers: edgerun generates one per request (n: 1)", 1),
    "best_of": refused("is not supported: one completion is generated per request", 1),
    "logprobs": refused("are not supported: edgerun returns no logprobs; leave it out", False, 0),
    "top_logprobs": refused("is not supported: edgerun returns no logprobs; leave it out", 0),
    "logit_bias": refused("is not supported: the backends take no per-token bias; leave it out", {}),
    "echo": refused("is not supported: the answer never repeats the prompt", False),
    "suffix": refused("is not supported (no fill-in-the-middle); leave it out", ""),
    "modalities": refused("asks for output other than text; the served models write text only", ["text"]),
    "audio": refused("asks for audio output; the served models write text only"),
    "prediction": refused("is not supported (no predicted-output decoding); leave it out"),
    "reasoning_effort": refused("applies to reasoning models; the served models do not reason"),
    "reasoning": refused("applies to reasoning models; the served models do not reason"),
    "thinking": refused("applies to reasoning models; the served models do not reason"),
    "verbosity": refused("is not supported: the served models take no verbosity control; use max_tokens"),
    "web_search_options": refused("asks for web search; edgerun runs the model alone"),
    # vLLM's, SGLang's and TGI's extensions
    **{name: refused(_SAMPLER, *no_ops) for name, no_ops in (
        ("min_p", (0,)), ("min_tokens", (0,)), ("ignore_eos", (False,)), ("stop_token_ids", ([],)),
        ("include_stop_str_in_output", (False,)), ("bad_words", ([],)), ("allowed_token_ids", ()),
        ("typical_p", (1,)), ("length_penalty", (1,)), ("use_beam_search", (False,)), ("do_sample", ()),
        ("skip_special_tokens", (True,)), ("truncate_prompt_tokens", ()), ("prompt_logprobs", ()),
    )},
    **{name: refused(_DECODING) for name in ("guided_regex", "guided_choice", "guided_grammar", "structural_tag")},
    **{name: refused(_TEMPLATE) for name in (
        "chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message")},
    # Workers AI's batch API
    "requests": refused(_BATCH),
    "queueRequest": refused(_BATCH, False),
}

WORKERS_AI: Mapping[str, FieldRule] = {
    **{name: HONOURED for name in ("prompt", "messages", "stream", "raw", "stop", *_SAMPLING, *_PENALTIES)},
    **{name: HONOURED for name in ("response_format", "guided_json", "tools", "tool_choice", OPTIONS_FIELD, "lora")},
    "model": ignored("the URL names the model"),
}

_OPENAI_SHARED: Mapping[str, FieldRule] = {
    **{name: HONOURED for name in ("model", "stream", "stream_options", "stop", "n", "logprobs", OPTIONS_FIELD)},
    **{name: HONOURED for name in (*_SAMPLING, *_PENALTIES)},  # n: 1 and logprobs: false only (schemas.py)
    "user": ignored("an end-user id for the provider's abuse monitoring; it never changes the output"),
    "safety_identifier": ignored("the newer name of `user`: abuse monitoring only"),
    "metadata": ignored("tags for OpenAI's stored-completions dashboard; edgerun stores no completions"),
    "store": ignored("asks OpenAI to keep the completion for its dashboard; the answer does not depend on it"),
    "service_tier": ignored("OpenAI's capacity tier; edgerun has one"),
    "prompt_cache_key": ignored("a cache-routing hint; edgerun routes by prefix blocks and x-session-affinity"),
    "prompt_cache_retention": ignored("how long OpenAI keeps a prompt cache; edgerun's KV cache is bounded by memory"),
}

OPENAI_CHAT: Mapping[str, FieldRule] = {
    **_OPENAI_SHARED,
    "messages": HONOURED,
    "max_completion_tokens": HONOURED,
    **{name: HONOURED for name in ("response_format", "tools", "tool_choice", "parallel_tool_calls")},
}

OPENAI_COMPLETIONS: Mapping[str, FieldRule] = {
    **_OPENAI_SHARED,
    "prompt": HONOURED,
    "response_format": HONOURED,
}

OPENAI_RESPONSES: Mapping[str, FieldRule] = {
    **{name: HONOURED for name in ("model", "input", "instructions", "max_output_tokens", "stream", "stop")},
    # temperature and top_p as OpenAI's; the others beyond it, as on the other routes
    **{name: HONOURED for name in ("temperature", "top_p", "top_k", "seed", "repetition_penalty", *_PENALTIES)},
    **{name: HONOURED for name in ("stream_options", OPTIONS_FIELD)},  # stream_options.include_obfuscation
    "max_tokens": refused("is the chat name: send max_output_tokens to the Responses API"),
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
    "include": refused("asks for extra output data (logprobs, encrypted reasoning) edgerun does not produce", []),
    "background": refused("is not supported: responses are answered while the request is open", False),
    "truncation": refused("auto is not supported: a conversation longer than the context is refused, never cut",
                          "disabled"),
    "max_tool_calls": refused("is not supported: the model's calls are returned, not run; leave it out"),
    "prompt": refused("names a stored prompt template; edgerun stores none: send the text as input"),
}

# Workers AI's request options (`options: {...}` in the body, also on /ai/v1), read by schemas.py.
OPTIONS: Mapping[str, FieldRule] = {
    "rejectIfBusy": HONOURED,  # 429 / 3040 at once instead of waiting for capacity
    "queueRequest": refused(_BATCH, False),
}

EMBEDDINGS_REFUSED: Mapping[str, FieldRule] = {
    "pooling": refused("is fixed by the model's checkpoint (mean for all-MiniLM-L6-v2); leave it out", "mean"),
    "dimensions": refused("is not supported: vectors have the model's own size; leave it out"),
    "requests": refused(_BATCH),
    "queueRequest": refused(_BATCH, False),
}

_EMBEDDING_OPTIONS = ignored("rejectIfBusy applies to text generation; an embedding request never waits in the "
                             "gateway (a tenant at its limit is answered 429 at once)")

WORKERS_AI_EMBEDDINGS: Mapping[str, FieldRule] = {
    "text": HONOURED,
    OPTIONS_FIELD: _EMBEDDING_OPTIONS,
}

OPENAI_EMBEDDINGS: Mapping[str, FieldRule] = {
    "model": HONOURED,
    "input": HONOURED,
    "encoding_format": HONOURED,  # "float" or "base64" (what the openai SDK asks for by default)
    "user": _OPENAI_SHARED["user"],
    OPTIONS_FIELD: _EMBEDDING_OPTIONS,
}


def accepted_fields(
    body: Mapping[str, Any], rules: Mapping[str, FieldRule], where: str, refusals: Mapping[str, FieldRule],
    *, param_prefix: str = "",
) -> dict[str, Any]:
    """`body`'s known fields with a value, after the rule above: a field `rules` (then `refusals`)
    refuses, or a near miss of a known name, raises InvalidInput naming it; nulls and unknown
    fields are left out."""
    kept: dict[str, Any] = {}
    for name, value in body.items():
        if value is None:
            continue
        rule = rules.get(name) or refusals.get(name)
        if rule is None:
            _refuse_near_miss(name, param_prefix, where, rules, refusals)
            continue
        if not rule.allows(value):
            raise InvalidInput(f"{param_prefix}{name} {rule.reason}", param=param_prefix + name)
        kept[name] = value
    return kept


def _refuse_near_miss(
    name: str, param_prefix: str, where: str, rules: Mapping[str, FieldRule], refusals: Mapping[str, FieldRule]
) -> None:
    """InvalidInput when `name` is a typo of a field the route accepts ("did you mean"), or of one it
    refuses (with that one's reason); nothing otherwise."""
    accepted = [n for n, rule in rules.items() if rule.treatment is not Treatment.REFUSED]
    meant = near_miss(name, accepted)
    if meant is not None:
        raise InvalidInput(f"{param_prefix}{name} is not a field of {where}: did you mean {meant}?",
                           param=param_prefix + name)
    meant = near_miss(name, [n for n in [*rules, *refusals] if n not in accepted])
    if meant is not None:
        rule = rules.get(meant) or refusals[meant]
        raise InvalidInput(f"{param_prefix}{name} is not a field of {where}; {meant} {rule.reason}",
                           param=param_prefix + name)


def near_miss(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` is a typo of (case, `_` and `-` aside, then at most about one edit in
    five characters), or None."""
    by_folded = {_fold(k): k for k in known}
    folded = _fold(name)
    if folded in by_folded:
        return by_folded[folded]
    close = difflib.get_close_matches(folded, by_folded, n=1, cutoff=0.8)
    return by_folded[close[0]] if close else None


def _fold(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")
