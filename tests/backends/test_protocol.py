from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from backends.server.errors import from_validation_error
from backends.server.protocol import ChatCompletionRequest, CompletionRequest
from engines.errors import InvalidRequest
from engines.guided import Guide


def test_defaults_and_sampling_mapping() -> None:
    request = CompletionRequest.model_validate({"prompt": [1, 2], "top_k": -1, "stop": "END", "seed": 3})
    sampling = request.sampling_params(max_tokens=5)
    assert sampling.max_tokens == 5 and sampling.top_k is None and sampling.stop == ["END"] and sampling.seed == 3
    assert request.temperature == 1.0 and not request.include_usage


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "n": 3}, "n"),
        ({"prompt": "x", "temperature": True}, "temperature"),
        ({"prompt": "x", "top_k": -5}, "top_k"),
        ({"prompt": "x", "stop": [""]}, "stop"),
        ({"prompt": [[1], [2]]}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": "x", "logprobs": 3}, "logprobs"),
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "tools": []}, "tools"),
    ],
)
def test_invalid_bodies_name_the_param(body: dict, param: str) -> None:
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate(body)
    assert from_validation_error(info.value).param.split(".")[0] == param


def test_chat_request() -> None:
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
         "max_completion_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert request.chat_messages()[1] == {"role": "user", "content": "hi"}
    assert request.include_usage and request.max_completion_tokens == 4


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.mark.parametrize(
    "fields",
    [
        {"response_format": {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}},
        {"response_format": {"type": "json_schema", "json_schema": SCHEMA}},  # trtllm-serve: the bare schema
        {"response_format": {"type": "json", "schema": SCHEMA}},  # trtllm-serve's own type
        {"guided_json": SCHEMA},  # vLLM's older field
        {"guided_json": json.dumps(SCHEMA)},
    ],
)
def test_every_json_schema_shape_becomes_the_same_guide(fields: dict) -> None:
    sampling = CompletionRequest.model_validate({"prompt": [1], **fields}).sampling_params(max_tokens=4)
    assert sampling.guide == Guide.json_schema(SCHEMA)


def test_json_object_text_and_structural_tag_formats() -> None:
    def guide(response_format: dict) -> Guide | None:
        return CompletionRequest.model_validate({"prompt": [1], "response_format": response_format}).guide()

    assert guide({"type": "json_object"}) == Guide("json_object")
    assert guide({"type": "text"}) is None
    tag = guide({"type": "structural_tag", "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}], "triggers": ["<f"]})
    assert tag is not None and tag.kind == "structural_tag" and tag.value["triggers"] == ["<f"]


@pytest.mark.parametrize(
    "response_format",
    [{"type": "json_schema"}, {"type": "structural_tag", "structures": [], "triggers": []}],
)
def test_a_format_missing_its_schema_is_an_invalid_request(response_format: dict) -> None:
    with pytest.raises(InvalidRequest):
        ChatCompletionRequest.model_validate(
            {"messages": [{"role": "user", "content": "x"}], "response_format": response_format}
        ).sampling_params(max_tokens=4)


def test_regex_formats_are_refused_by_validation() -> None:
    with pytest.raises(ValidationError, match="response_format"):
        CompletionRequest.model_validate({"prompt": [1], "response_format": {"type": "regex", "regex": "a+"}})
