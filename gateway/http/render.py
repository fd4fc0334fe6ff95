"""Turning a `Generation` (or a cached answer's `Replay`: pipeline/replay.py) into HTTP responses:
Workers AI or OpenAI, streamed or whole.

Streams are forwarded chunk by chunk as the backend sends them. The generation's text iterator is
always closed (`aclosing`), so a client that goes away - Starlette then cancels this iterator -
closes the backend stream and settles the accounting at once. A whole (non-streamed) answer is
collected while the client's connection is watched (`collect_or_cancel`): a client that leaves
first cancels it the same way, and it is billed as `cancelled` for what was generated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Coroutine
from contextlib import aclosing
from typing import Any, TypeVar

from starlette.responses import Response
from starlette.types import Receive

from contracts.sse import DONE, EventStream
from contracts.usage import Usage
from gateway.errors import GatewayError
from gateway.http import envelopes, sse
from gateway.http.envelopes import JSONBytes
from gateway.pipeline.replay import Answer
from gateway.pipeline.schemas import GenerationInput
from gateway.pipeline.tools import CallDelta, CallStream, ToolCall, ToolUse

T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left; nobody reads it, the logs do


async def _disconnected(receive: Receive) -> None:
    """Returns once the client has gone (the request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(work: Coroutine[Any, Any, T], receive: Receive) -> T | None:
    """`work`'s result, or None when the client disconnected first: `work` is then cancelled (which
    closes its backend request, so the backend stops) and awaited, so its accounting is settled."""
    working = asyncio.ensure_future(work)
    watching = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({working, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (watching, working):
            if not task.done():
                task.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    if working.cancelled() or not working.done():
        with contextlib.suppress(asyncio.CancelledError):
            await working
        return None
    return working.result()


async def collect_or_cancel(generation: Answer, receive: Receive) -> str | None:
    """The whole text, or None when the client disconnected first: the generation is then
    cancelled (its backend stream closed, so the backend aborts) and settled as `cancelled`."""
    return await unless_disconnected(generation.collect(), receive)


def _usage(generation: Answer) -> Usage:
    assert generation.usage is not None, "usage is set when the text iterator ends"
    return generation.usage


# ---- Workers AI -------------------------------------------------------------------------------


async def workers_ai_events(generation: Answer, tools: ToolUse | None = None) -> AsyncIterator[bytes]:
    rng = sse.padding_source()
    calls = CallStream(tools) if tools is not None else None
    async with aclosing(generation.text_batches()) as batches:
        try:
            async for texts in batches:
                if calls is None:  # an event per delta, written together
                    yield b"".join([sse.workers_ai_chunk(text, rng) for text in texts])
                    continue
                for text in texts:
                    for piece in calls.feed(text):
                        if isinstance(piece, str) and piece:
                            yield sse.workers_ai_chunk(piece, rng)
        except GatewayError as error:
            yield sse.workers_ai_error(error)
            return
    if calls is not None:  # Workers AI sends whole calls, once, before the usage
        for piece in calls.finish():
            if isinstance(piece, str):
                yield sse.workers_ai_chunk(piece, rng)
        if calls.calls:
            yield sse.workers_ai_tool_calls([c.workers_ai() for c in calls.calls])
    yield sse.workers_ai_usage(_usage(generation))
    yield DONE


def _json_or_text(text: str) -> Any:
    """JSON mode's answer as an object, as Workers AI returns it; the text when max_tokens cut it."""
    try:
        return json.loads(text)
    except ValueError:
        return text


async def workers_ai_response(generation: Answer, inp: GenerationInput, receive: Receive) -> Response:
    if inp.stream:
        return EventStream(workers_ai_events(generation, inp.tools), generation.aclose)
    text = await collect_or_cancel(generation, receive)
    if text is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return JSONBytes(envelopes.workers_ai_success(workers_ai_result(generation, inp, text)))


def workers_ai_result(generation: Answer, inp: GenerationInput, text: str) -> dict[str, Any]:
    """A finished generation's Workers AI `result` (also a batch item's, gateway/http/batch_worker.py)."""
    usage = _usage(generation)
    if inp.tools is not None:
        rest, calls = inp.tools.split_calls(text)
        return envelopes.workers_ai_text_result(rest, usage, [c.workers_ai() for c in calls])
    response = _json_or_text(text) if inp.response_format is not None else text
    return envelopes.workers_ai_text_result(response, usage)


# ---- OpenAI -----------------------------------------------------------------------------------


def _completion_id(generation: Answer, chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{generation.ctx.request_id}"


async def openai_events(
    generation: Answer, stream: sse.OpenAIStream, tools: ToolUse | None = None
) -> AsyncIterator[bytes]:
    first = stream.first()
    if first is not None:
        yield first
    calls = CallStream(tools) if tools is not None else None
    async with aclosing(generation.text_batches()) as batches:
        try:
            async for texts in batches:
                if calls is None:  # an event per delta, written together
                    yield b"".join([stream.text(text) for text in texts])
                    continue
                for text in texts:
                    for piece in calls.feed(text):
                        yield _openai_piece(stream, piece)
        except GatewayError as error:
            yield stream.error(error)
            return
    finish_reason = generation.finish_reason
    if calls is not None:
        for piece in calls.finish():
            yield _openai_piece(stream, piece)
        if calls.has_calls and finish_reason != "length":
            finish_reason = "tool_calls"
    yield stream.finish(finish_reason)
    usage = stream.usage(_usage(generation))
    if usage is not None:
        yield usage
    yield DONE


def _openai_piece(stream: sse.OpenAIStream, piece: str | CallDelta) -> bytes:
    return stream.text(piece) if isinstance(piece, str) else stream.tool_calls([piece.openai()])


async def openai_response(generation: Answer, inp: GenerationInput, receive: Receive, *, chat: bool) -> Response:
    completion_id = _completion_id(generation, chat)
    model = generation.ctx.model_id
    if inp.stream:
        encoder = sse.OpenAIStream(completion_id, generation.created, model, chat=chat, include_usage=inp.include_usage)
        return EventStream(openai_events(generation, encoder, inp.tools), generation.aclose)
    text = await collect_or_cancel(generation, receive)
    if text is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    usage, finish_reason = _usage(generation), generation.finish_reason
    if not chat:
        return JSONBytes(envelopes.text_completion(completion_id, generation.created, model, text, finish_reason, usage))
    calls: list[ToolCall] = []
    if inp.tools is not None:
        text, calls = inp.tools.split_calls(text)
    tool_calls = [c.openai() for c in calls]
    return JSONBytes(
        envelopes.chat_completion(completion_id, generation.created, model, text, finish_reason, usage, tool_calls)
    )
