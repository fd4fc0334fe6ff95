from __future__ import annotations

from collections.abc import AsyncIterator

from backends.client.sse import SSEDecoder, iter_sse_data
from backends.client.types import CompletionChunk
from contracts.usage import Usage


async def pieces(*items: bytes) -> AsyncIterator[bytes]:
    for item in items:
        yield item


async def test_events_comments_and_multiline_data() -> None:
    body = b': keep-alive\n\ndata: {"a": 1}\n\nevent: x\ndata: one\ndata:two\n\ndata: [DONE]'
    assert [data async for data in iter_sse_data(pieces(body))] == ['{"a": 1}', "one\ntwo", "[DONE]"]


async def test_events_split_anywhere_between_reads() -> None:
    body = 'data: {"t": "h\u00e9"}\r\n\r\ndata: x\rdata: y\r\rdata: [DONE]\n\n'.encode()
    expected = ['{"t": "h\u00e9"}', "x\ny", "[DONE]"]
    for size in (1, 2, 3, 7, len(body)):  # \r\n and the 2-byte character are cut in two at some sizes
        split = [body[i : i + size] for i in range(0, len(body), size)]
        assert [data async for data in iter_sse_data(pieces(*split))] == expected, size


async def test_lf_only_bodies_split_anywhere() -> None:
    """Bodies without CR take the decoder's fast path: the same events, however the reads fall."""
    body = (
        b': keep-alive\n\ndata: {"t": "h\xc3\xa9"}\n\nevent: x\ndata: one\ndata:two\n\n\n\n'
        b"id: 7\ndata: three\n\ndata: [DONE]\n\ndata: after"
    )
    expected = ['{"t": "h\u00e9"}', "one\ntwo", "three", "[DONE]", "after"]
    for size in range(1, len(body) + 1):
        split = [body[i : i + size] for i in range(0, len(body), size)]
        assert [data async for data in iter_sse_data(pieces(*split))] == expected, size


def test_decoder_returns_events_as_soon_as_they_end() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n") == []
    assert decoder.feed(b"\ndata: b\n\nda") == ["a", "b"]
    assert decoder.feed(b"ta: c") == []
    assert decoder.end() == ["c"]


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
