"""Turning a `Generation` into HTTP responses: Workers AI or OpenAI, streamed or whole.

Streams are forwarded chunk by chunk as the backend sends them. The generation's text iterator is
always closed (`aclosing`), so a client that goes away - Starlette then cancels this iterator -
closes the backend stream and settles the accounting at once. A whole (non-streamed) answer is
collected while the client's connection is watched (`collect_or_cancel`): a client that leaves
first cancels it the same way, and it is billed as `cancelled` for what was generated.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import aclosing

from starlette.responses import Response
from starlette.types import Receive

from contracts.sse import DONE, EventStream
from contracts.usage import Usage
from gateway.errors import GatewayError
from gateway.http import envelopes, sse
from gateway.http.envelopes import JSONBytes
from gateway.pipeline.generation import Generation

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left; nobody reads it, the logs do


async def _disconnected(receive: Receive) -> None:
    """Returns once the client has gone (the request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def collect_or_cancel(generation: Generation, receive: Receive) -> str | None:
    """The whole text, or None when the client disconnected first: the generation is then
    cancelled (its backend stream closed, so the backend aborts) and settled as `cancelled`."""
    collecting = asyncio.ensure_future(generation.collect())
    watching = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({collecting, watching}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (watching, collecting):
            if not task.done():
                task.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    if collecting.cancelled() or not collecting.done():
        with contextlib.suppress(asyncio.CancelledError):
            await collecting  # its texts() settle the accounting as `cancelled`
        return None
    return collecting.result()


def _usage(generation: Generation) -> Usage:
    assert generation.usage is not None, "usage is set when the text iterator ends"
    return generation.usage


# ---- Workers AI -------------------------------------------------------------------------------


async def workers_ai_events(generation: Generation) -> AsyncIterator[bytes]:
    rng = sse.padding_source()
    async with aclosing(generation.texts()) as texts:
        try:
            async for text in texts:
                yield sse.workers_ai_chunk(text, rng)
        except GatewayError as error:
            yield sse.workers_ai_error(error)
            return
    yield sse.workers_ai_usage(_usage(generation))
    yield DONE


async def workers_ai_response(generation: Generation, stream: bool, receive: Receive) -> Response:
    if stream:
        return EventStream(workers_ai_events(generation), generation.aclose)
    text = await collect_or_cancel(generation, receive)
    if text is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    return JSONBytes(envelopes.workers_ai_success(envelopes.workers_ai_text_result(text, _usage(generation))))


# ---- OpenAI -----------------------------------------------------------------------------------


def _completion_id(generation: Generation, chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{generation.meta.request_id}"


async def openai_events(generation: Generation, stream: sse.OpenAIStream) -> AsyncIterator[bytes]:
    first = stream.first()
    if first is not None:
        yield first
    async with aclosing(generation.texts()) as texts:
        try:
            async for text in texts:
                yield stream.text(text)
        except GatewayError as error:
            yield stream.error(error)
            return
    yield stream.finish(generation.finish_reason)
    usage = stream.usage(_usage(generation))
    if usage is not None:
        yield usage
    yield DONE


async def openai_response(
    generation: Generation, receive: Receive, *, chat: bool, stream: bool, include_usage: bool
) -> Response:
    completion_id = _completion_id(generation, chat)
    model = generation.meta.model.id
    if stream:
        encoder = sse.OpenAIStream(completion_id, generation.created, model, chat=chat, include_usage=include_usage)
        return EventStream(openai_events(generation, encoder), generation.aclose)
    text = await collect_or_cancel(generation, receive)
    if text is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    build = envelopes.chat_completion if chat else envelopes.text_completion
    return JSONBytes(
        build(completion_id, generation.created, model, text, generation.finish_reason, _usage(generation))
    )
