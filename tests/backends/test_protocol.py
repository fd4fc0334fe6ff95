from __future__ import annotations

import pytest
from pydantic import ValidationError

from backends.server.errors import from_validation_error
from backends.server.protocol import ChatCompletionRequest, CompletionRequest


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
