"""The OpenAI Responses API's dialect: the `response` object and its stream of semantic events.

A whole answer is one `response` object (`object: "response"`) whose `output` holds one assistant
`message` item with one `output_text` part, and whose `usage` counts `input_tokens` (with
`input_tokens_details.cached_tokens`) and `output_tokens`. An answer cut by `max_output_tokens`
has `status: "incomplete"` and `incomplete_details.reason: "max_output_tokens"`.

A stream is SSE with an `event:` line naming each event and a `sequence_number` counting from 0:

    response.created, response.in_progress          the response, status in_progress, no output
    response.output_item.added                      the message item, status in_progress
    response.content_part.added                     an empty output_text part
    response.output_text.delta ...                  the text as it comes (with random `obfuscation`
                                                    padding unless stream_options says otherwise)
    response.output_text.done, response.content_part.done, response.output_item.done
    response.completed | response.incomplete        the final response, usage included

A stream that breaks after it started ends with `response.failed` (status failed, `error` set).
There is no `data: [DONE]`. Billing is the generation's, as on every route: settled once however
the response ends.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from starlette.responses import Response
from starlette.types import Receive

from contracts.sse import EventStream as SSEResponse
from contracts.sse import dumps
from contracts.usage import Usage
from gateway.errors import GatewayError
from gateway.http import sse
from gateway.http.envelopes import JSONBytes
from gateway.http.render import CLIENT_CLOSED_REQUEST, collect_or_cancel
from gateway.pipeline.generation import Generation
from gateway.pipeline.schemas import ResponsesInput


def usage_object(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total_tokens,
    }


class ResponseShape:
    """The fixed fields of one response; each method returns a part of the wire format."""

    def __init__(self, generation: Generation, inp: ResponsesInput) -> None:
        self.generation = generation
        self.inp = inp
        self.response_id = f"resp_{generation.meta.request_id}"
        self.item_id = f"msg_{generation.meta.request_id}"

    def part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def item(self, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [self.part(text)]
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant", "content": content}

    def response(self, status: str, output: list[dict[str, Any]], usage: Usage | None = None,
                 error: GatewayError | None = None) -> dict[str, Any]:
        sampling = self.inp.generation.sampling
        body: dict[str, Any] = {
            "id": self.response_id,
            "object": "response",
            "created_at": self.generation.created,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": None if error is None else {"code": "server_error", "message": error.message},
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": self.inp.instructions,
            "max_output_tokens": self.inp.max_output_tokens,
            "model": self.generation.meta.model.id,
            "output": output,
            "parallel_tool_calls": False,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": sampling.temperature,
            "text": self.inp.text if self.inp.generation.response_format is not None else {"format": {"type": "text"}},
            "tool_choice": "none",
            "tools": [],
            "top_p": sampling.top_p,
            "truncation": "disabled",
            "usage": None if usage is None else usage_object(usage),
            "metadata": {},
        }
        return body

    def final_status(self) -> str:
        return "incomplete" if self.generation.finish_reason == "length" else "completed"

    def whole(self, text: str, usage: Usage) -> dict[str, Any]:
        status = self.final_status()
        return self.response(status, [self.item(text, status)], usage)


class EventStream:
    """Numbers and encodes the events of one stream."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(payload) + b"\n\n"


async def response_events(generation: Generation, shape: ResponseShape) -> AsyncIterator[bytes]:
    emit = EventStream()
    where = {"item_id": shape.item_id, "output_index": 0, "content_index": 0}
    yield emit("response.created", response=shape.response("in_progress", []))
    yield emit("response.in_progress", response=shape.response("in_progress", []))
    yield emit("response.output_item.added", output_index=0, item=shape.item(None, "in_progress"))
    yield emit("response.content_part.added", **where, part=shape.part(""))
    rng = sse.padding_source()
    async with aclosing(generation.texts()) as texts:
        try:
            async for text in texts:
                padding = {"obfuscation": sse.padding(rng)} if shape.inp.obfuscate else {}
                yield emit("response.output_text.delta", **where, delta=text, logprobs=[], **padding)
        except GatewayError as error:
            failed = shape.response("failed", [shape.item(generation.text, "incomplete")], error=error)
            yield emit("response.failed", response=failed)
            return
    text, status = generation.text, shape.final_status()
    assert generation.usage is not None, "usage is set when the text iterator ends"
    yield emit("response.output_text.done", **where, text=text, logprobs=[])
    yield emit("response.content_part.done", **where, part=shape.part(text))
    yield emit("response.output_item.done", output_index=0, item=shape.item(text, status))
    yield emit(f"response.{status}", response=shape.whole(text, generation.usage))


async def responses_response(generation: Generation, inp: ResponsesInput, receive: Receive) -> Response:
    shape = ResponseShape(generation, inp)
    if inp.generation.stream:
        return SSEResponse(response_events(generation, shape), generation.aclose)
    text = await collect_or_cancel(generation, receive)
    if text is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    assert generation.usage is not None, "usage is set when the text iterator ends"
    return JSONBytes(shape.whole(text, generation.usage))
