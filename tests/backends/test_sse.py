from __future__ import annotations

from collections.abc import AsyncIterator

from backends.client.sse import iter_sse_data
from backends.client.types import CompletionChunk, Usage


async def lines(*items: str) -> AsyncIterator[str]:
    for item in items:
        yield item


async def test_events_comments_and_multiline_data() -> None:
    stream = lines(": keep-alive", "", "data: {\"a\": 1}", "", "event: x", "data: one", "data:two", "", "data: [DONE]")
    assert [data async for data in iter_sse_data(stream)] == ['{"a": 1}', "one\ntwo", "[DONE]"]


def test_chunk_from_completion_chat_and_usage_payloads() -> None:
    text = CompletionChunk.from_json({"choices": [{"index": 0, "text": "hi", "finish_reason": None, "token_ids": [5]}]})
    assert (text.text, text.token_ids, text.finish_reason, text.usage) == ("hi", [5], None, None)
    chat = CompletionChunk.from_json({"choices": [{"index": 0, "delta": {"content": "yo"}, "finish_reason": "stop"}]})
    assert (chat.text, chat.token_ids, chat.finish_reason) == ("yo", None, "stop")
    final = CompletionChunk.from_json({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2,
                                                                 "prompt_tokens_details": {"cached_tokens": 8}}})
    assert final.usage == Usage(prompt_tokens=9, completion_tokens=2, cached_tokens=8)


def test_usage_without_details_counts_no_cached_tokens() -> None:
    usage = Usage.from_json({"prompt_tokens": 3, "completion_tokens": 1, "prompt_tokens_details": None})
    assert usage.cached_tokens == 0
    assert Usage.from_json({"prompt_tokens": 3, "completion_tokens": 1}).total_tokens == 4
