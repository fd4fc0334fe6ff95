"""No silent ignoring: fields the gateway does not honour are refused by name; no-op values and the
official clients' own fields pass."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidInput
from gateway.pipeline.embedding_input import parse_openai_embedding, parse_workers_ai_embedding
from gateway.pipeline.request_fields import (
    OPENAI_CHAT,
    OPENAI_COMPLETIONS,
    OPENAI_EMBEDDINGS,
    WORKERS_AI,
    WORKERS_AI_EMBEDDINGS,
    Treatment,
)
from gateway.pipeline.schemas import parse_chat_completions, parse_completions, parse_workers_ai

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("functions", [{"name": "f", "parameters": {"type": "object"}}]),
        ("response_format", {"type": "regex"}),
        ("tool_choice", "required"),  # without tools
        ("lora", "my-adapter"),
        ("max_token", 5),  # misspelt: would otherwise run with 256 tokens
    ],
)
def test_workers_ai_refuses_what_it_would_ignore(field: str, value: Any) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_workers_ai({"prompt": "hi", field: value})
    assert caught.value.param == field and field in caught.value.message


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("response_format", {"type": "json_schema", "json_schema": {"type": "object"}}),  # no name: not OpenAI's
        ("tools", [{"type": "function", "function": {"name": ""}}]),
        ("tool_choice", "required"),
        ("tool_choice", {"type": "function", "function": {"name": "f"}}),
        ("function_call", "auto"),
        ("logit_bias", {"50256": -100}),
        ("top_logprobs", 2),
        ("modalities", ["text", "audio"]),
        ("reasoning_effort", "high"),
        ("frobnicate", True),
    ],
)
def test_chat_refuses_what_it_would_ignore(field: str, value: Any) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_chat_completions({**CHAT, field: value})
    assert caught.value.param == field and field in caught.value.message


@pytest.mark.parametrize(("field", "value"), [("echo", True), ("suffix", "end"), ("best_of", 3), ("tools", [TOOL])])
def test_completions_refuse_what_they_would_ignore(field: str, value: Any) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_completions({"model": "m", "prompt": "x", field: value})
    assert caught.value.param == field


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("response_format", {"type": "text"}),
        ("tools", []),
        ("tool_choice", "none"),
        ("tools", None),
        ("modalities", ["text"]),
        ("logit_bias", {}),
        ("user", "end-user-7"),
        ("metadata", {"job": "nightly"}),
        ("store", False),
        ("parallel_tool_calls", False),
        ("response_format", {"type": "json_object"}),
        ("response_format", JSON_SCHEMA),
        ("tools", [TOOL]),
        ("prompt_cache_key", "conversation-1"),
    ],
)
def test_no_op_values_honoured_and_harmless_fields_pass(field: str, value: Any) -> None:
    assert parse_chat_completions({**CHAT, field: value}).prompt.messages[-1] == {"role": "user", "content": "hi"}


def test_the_clients_usual_fields_all_pass() -> None:
    """What the openai and cloudflare SDKs send for ordinary text generation when asked to."""
    sampling = {"max_tokens": 8, "temperature": 0.5, "top_p": 0.9, "seed": 3, "presence_penalty": 0.1}
    parse_chat_completions({**CHAT, **sampling, "stream": True, "stream_options": {"include_usage": True},
                            "stop": ["\n"], "n": 1, "logprobs": False, "max_completion_tokens": 8, "user": "u"})
    parse_completions({"model": "m", "prompt": "x", **sampling, "stream": False, "echo": False, "best_of": 1})
    parse_workers_ai({"prompt": "x", **sampling, "top_k": 5, "repetition_penalty": 1.1, "frequency_penalty": 0.1,
                      "raw": False, "stream": False})


def test_every_ignored_field_says_why() -> None:
    for table in (WORKERS_AI, OPENAI_CHAT, OPENAI_COMPLETIONS, WORKERS_AI_EMBEDDINGS, OPENAI_EMBEDDINGS):
        for name, rule in table.items():
            assert rule.treatment is Treatment.HONOURED or rule.reason, name


def test_embedding_bodies() -> None:
    assert parse_workers_ai_embedding({"text": "a"}) == ("a",)
    assert parse_openai_embedding({"model": "m", "input": ["a", "b"], "user": "u"}) == (("a", "b"), "float")
    assert parse_openai_embedding({"model": "m", "input": "a", "encoding_format": "base64"})[1] == "base64"
    for body, field in [
        ({"text": ["a"] * 101}, "text"),
        ({"text": [""]}, "text"),
        ({"text": "a", "pooling": "cls"}, "pooling"),
        ({"text": "a", "prompt": "b"}, "prompt"),
    ]:
        with pytest.raises(InvalidInput) as caught:
            parse_workers_ai_embedding(body)
        assert caught.value.param == field
    for body, field in [
        ({"model": "m", "input": "a", "dimensions": 64}, "dimensions"),
        ({"model": "m", "input": "a", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "m", "input": [1, 2]}, "input"),
    ]:
        with pytest.raises(InvalidInput) as caught:
            parse_openai_embedding(body)
        assert caught.value.param == field
