from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

from backends.client.sse import SSEDecoder
from backends.client.types import CompletionChunk
from contracts.usage import Usage


async def pieces(*items: bytes) -> AsyncIterator[bytes]:
    for item in items:
        yield item


async def iter_sse_data(chunks: AsyncIterator[bytes]) -> AsyncGenerator[str, None]:
    # the data of each event in a body read as `chunks`, as the client's reader feeds the decoder
    decoder = SSEDecoder()
    async for chunk in chunks:
        for data in decoder.feed(chunk):
            yield data
    for data in decoder.end():
        yield data


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


def test_usage_counts_that_are_no_numbers_read_as_zero() -> None:
    """A third-party backend's odd report must not break a stream that already ran (Usage.from_json)."""
    odd = {"prompt_tokens": "many", "completion_tokens": float("nan"), "prompt_tokens_details": {"cached_tokens": {}}}
    assert Usage.from_json(odd) == Usage(0, 0, 0)
    assert Usage.from_json({"prompt_tokens": "12", "completion_tokens": 3.0, "prompt_tokens_details": []}) == Usage(12, 3)
    assert Usage.from_json({"prompt_tokens": 5, "completion_tokens": float("inf")}) == Usage(5, 0)


def test_a_chunks_usage_is_read_when_asked_for() -> None:
    event = {"choices": [{"index": 0, "text": "a", "finish_reason": None}],
             "usage": {"prompt_tokens": 4, "completion_tokens": 1}}
    chunk = CompletionChunk.from_json(event)
    assert chunk.has_usage and chunk.usage == Usage(4, 1) and chunk.has_usage
    assert chunk == CompletionChunk("a", None, None, Usage(4, 1))
    chunk.usage = None
    assert not chunk.has_usage and chunk.usage is None
    assert not CompletionChunk.from_json({"choices": [], "usage": "lots"}).has_usage  # not an object: no report
