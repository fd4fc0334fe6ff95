"""SSE encoding for Workers AI and OpenAI streams."""

from __future__ import annotations

import json

from contracts.sse import DONE
from contracts.usage import Usage
from gateway.http import sse


def decode(event: bytes) -> dict:
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    return json.loads(event[6:-2])


def test_workers_ai_chunks_carry_random_padding() -> None:
    rng = sse.padding_source()
    events = [decode(sse.workers_ai_chunk("hel", rng)) for _ in range(20)]
    assert all(e["response"] == "hel" for e in events)
    paddings = [e["p"] for e in events]
    assert all(1 <= len(p) <= sse.MAX_PADDING_CHARS for p in paddings)
    assert len({len(p) for p in paddings}) > 1  # the length varies, which is the point
    first, second = sse.padding_source(), sse.padding_source()
    assert [sse.padding(first) for _ in range(20)] != [sse.padding(second) for _ in range(20)]
    lengths = {len(sse.padding(first)) for _ in range(2000)}  # every length, 1 to 32, comes up
    assert lengths == set(range(1, sse.MAX_PADDING_CHARS + 1))


def test_workers_ai_chunk_is_the_compact_json_event() -> None:
    """The hand-written encoding gives exactly what the JSON encoder would."""
    from contracts.sse import event

    for text in ["hel", "", 'quote " backslash \\ newline \n tab \t', "Café 東京 🙂", "\x00\x1f\u2028"]:
        encoded = sse.workers_ai_chunk(text, sse.padding_source())
        padding = decode(encoded)["p"]
        assert encoded == event({"response": text, "p": padding})
    final = decode(sse.workers_ai_usage(Usage(5, 2, 0)))
    assert final == {"response": "", "usage": Usage(5, 2, 0).as_dict()}
    assert DONE == b"data: [DONE]\n\n"


def test_openai_chat_stream_shape() -> None:
    stream = sse.OpenAIStream("chatcmpl-1", 7, "m", chat=True, include_usage=True)
    first = decode(stream.first())
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["usage"] is None
    assert decode(stream.text("Hi"))["choices"][0]["delta"] == {"content": "Hi"}
    finish = decode(stream.finish("length"))
    assert finish["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    usage = decode(stream.usage(Usage(3, 1, 2)))
    assert usage["choices"] == [] and usage["usage"]["prompt_tokens_details"]["cached_tokens"] == 2


def test_openai_completion_stream_without_usage() -> None:
    stream = sse.OpenAIStream("cmpl-1", 7, "m", chat=False, include_usage=False)
    assert stream.first() is None
    chunk = decode(stream.text("a"))
    assert chunk["object"] == "text_completion" and chunk["choices"][0]["text"] == "a" and "usage" not in chunk
    assert stream.usage(Usage(1, 1, 0)) is None
