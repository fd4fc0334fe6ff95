from __future__ import annotations

import json

from backends.server.generation import Completion
from backends.server.openai import Renderer
from contracts.sse import event
from contracts.usage import Usage
from engines.base import GenerationOutput


def output(text: str, ids: list[int], finish: str | None = None, generated: int = 1) -> GenerationOutput:
    return GenerationOutput("r", ids, text, num_prompt_tokens=10, num_cached_tokens=4, num_generated_tokens=generated,
                            finish_reason=finish)  # type: ignore[arg-type]


def test_usage_always_has_cached_tokens() -> None:
    assert Usage(10, 3, 0).as_dict() == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                               "prompt_tokens_details": {"cached_tokens": 0}}


def test_completion_chunks_skip_empty_deltas_but_not_the_finish() -> None:
    renderer = Renderer("cmpl-1", "smollm2", "completion")
    first = renderer.chunk(output("", [5]))  # a partial character: the first chunk is still sent
    assert first is not None and first["choices"][0]["text"] == ""
    assert renderer.chunk(output("", [6])) is None
    last = renderer.chunk(output("!", [7], "stop", 3))
    assert last["choices"][0] == {"index": 0, "text": "!", "logprobs": None, "finish_reason": "stop"}
    assert renderer.usage_chunk(output("", [], "stop", 3))["usage"]["prompt_tokens_details"] == {"cached_tokens": 4}


def test_chat_chunks_open_with_the_role() -> None:
    renderer = Renderer("chatcmpl-1", "smollm2", "chat", return_token_ids=True)
    first = renderer.chunk(output("Hi", [5]))
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "Hi"}
    assert first["choices"][0]["token_ids"] == [5]
    assert renderer.chunk(output("", [6], "length"))["choices"][0]["delta"] == {}


def test_whole_answers() -> None:
    completion = Completion("Paris", [1, 2], "stop", num_prompt_tokens=7, num_cached_tokens=0, num_generated_tokens=2)
    chat = Renderer("chatcmpl-2", "smollm2", "chat").answer(completion)
    assert chat["object"] == "chat.completion"
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": "Paris"}
    assert chat["usage"]["total_tokens"] == 9
    text = Renderer("cmpl-2", "smollm2", "completion", return_token_ids=True).answer(completion)
    assert text["choices"][0]["text"] == "Paris" and text["choices"][0]["token_ids"] == [1, 2]


def test_sse_framing() -> None:
    frame = event({"a": 1})
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n")
    assert json.loads(frame[6:]) == {"a": 1}
