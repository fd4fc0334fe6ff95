"""The OpenAI Responses API's dialect: the `response` object and its stream of semantic events.

A whole answer is one `response` object (`object: "response"`) whose `output` holds one assistant
`message` item with one `output_text` part (with `tools`: the text, if any, then one
`function_call` item per call: `call_id`, `name`, `arguments` as a JSON string), and whose `usage` counts `input_tokens` (with
`input_tokens_details.cached_tokens`) and `output_tokens`. An answer cut by `max_output_tokens`
has `status: "incomplete"` and `incomplete_details.reason: "max_output_tokens"`. `text.format` (JSON
mode) is echoed as sent; the backend's grammar enforces it.

A stream is SSE with an `event:` line naming each event and a `sequence_number` counting from 0:

    response.created, response.in_progress          the response, status in_progress, no output
    response.output_item.added                      the message item, status in_progress
    response.content_part.added                     an empty output_text part
    response.output_text.delta ...                  the text as it comes (with random `obfuscation`
                                                    padding unless stream_options says otherwise)
    response.output_text.done, response.content_part.done, response.output_item.done
    response.completed | response.incomplete        the final response, usage included

With `tools` a message opens only when text comes, and each call is sent once complete as its own
item: output_item.added (arguments empty), function_call_arguments.delta (all of them),
function_call_arguments.done, output_item.done.

A stream that breaks after it started ends with `response.failed` (status failed, `error` set).
There is no `data: [DONE]`. Billing is the generation's, as on every route: settled once however
the response ends.
"""

from __future__ import annotations

import json
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
from gateway.pipeline.tools import CallDelta, CallStream, ToolCall


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
        self.response_id = f"resp_{generation.ctx.request_id}"

    def message_id(self, output_index: int) -> str:
        suffix = f"_{output_index}" if output_index else ""
        return f"msg_{self.generation.ctx.request_id}{suffix}"

    def part(self, text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def item(self, output_index: int, text: str | None, status: str) -> dict[str, Any]:
        content = [] if text is None else [self.part(text)]
        return {"id": self.message_id(output_index), "type": "message", "status": status, "role": "assistant",
                "content": content}

    def call_item(self, call: ToolCall, arguments: str, status: str) -> dict[str, Any]:
        return {"id": f"fc_{call.id.removeprefix('call_')}", "type": "function_call", "status": status,
                "call_id": call.id, "name": call.name, "arguments": arguments}

    def _tools(self) -> tuple[list[dict[str, Any]], Any, bool]:
        use = self.inp.generation.tools
        if use is None:
            return [], "none", False
        tools = [{"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters,
                  "strict": False} for t in use.tools]
        choice: Any = {"type": "function", "name": use.named} if use.mode == "named" else use.mode
        return tools, choice, use.parallel

    def response(self, status: str, output: list[dict[str, Any]], usage: Usage | None = None,
                 error: GatewayError | None = None) -> dict[str, Any]:
        sampling = self.inp.generation.sampling
        tools, tool_choice, parallel = self._tools()
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": self.generation.created,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": None if error is None else {"code": "server_error", "message": error.message},
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": self.inp.instructions,
            "max_output_tokens": self.inp.max_output_tokens,
            "model": self.generation.ctx.model_id,
            "output": output,
            "parallel_tool_calls": parallel,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "temperature": sampling.temperature,
            "text": {"format": self.inp.text_format},
            "tool_choice": tool_choice,
            "tools": tools,
            "top_p": sampling.top_p,
            "truncation": "disabled",
            "usage": None if usage is None else usage_object(usage),
            "metadata": {},
        }

    def final_status(self) -> str:
        return "incomplete" if self.generation.finish_reason == "length" else "completed"

    def whole(self, text: str, usage: Usage) -> dict[str, Any]:
        """The whole answer: a message with its text (if any), then its function calls (if any)."""
        status, calls = self.final_status(), list[ToolCall]()
        if self.inp.generation.tools is not None:
            text, calls = self.inp.generation.tools.split_calls(text)
        output = [self.item(0, text, status)] if text or not calls else []
        output += [self.call_item(c, json.dumps(c.arguments, ensure_ascii=False), "completed") for c in calls]
        return self.response(status, output, usage)


class EventStream:
    """Numbers and encodes the events of one stream."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return b"event: " + kind.encode() + b"\ndata: " + dumps(payload) + b"\n\n"


class OutputEvents:
    """The output items of a streamed response as they form: a message opens with its first text
    and closes when a function call (or the end) comes; each call is one item, sent once complete."""

    def __init__(self, shape: ResponseShape, emit: EventStream) -> None:
        self.shape = shape
        self.emit = emit
        self.items: list[dict[str, Any]] = []  # closed items, in output order
        self._open: int | None = None  # output index of the open message
        self._text = ""
        self._rng = sse.padding_source()

    @property
    def is_empty(self) -> bool:
        return not self.items and self._open is None

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self.shape.message_id(self._open), "output_index": self._open, "content_index": 0}

    def open_message(self) -> list[bytes]:
        self._open, self._text = len(self.items), ""
        return [self.emit("response.output_item.added", output_index=self._open,
                          item=self.shape.item(self._open, None, "in_progress")),
                self.emit("response.content_part.added", **self._where(), part=self.shape.part(""))]

    def text(self, piece: str) -> list[bytes]:
        events = self.open_message() if self._open is None else []
        self._text += piece
        padding = {"obfuscation": sse.padding(self._rng)} if self.shape.inp.obfuscate else {}
        return events + [self.emit("response.output_text.delta", **self._where(), delta=piece, logprobs=[], **padding)]

    def close_message(self, status: str) -> list[bytes]:
        if self._open is None:
            return []
        where, text, index = self._where(), self._text, self._open
        item = self.shape.item(index, text, status)
        self.items.append(item)
        self._open = None
        return [self.emit("response.output_text.done", **where, text=text, logprobs=[]),
                self.emit("response.content_part.done", **where, part=self.shape.part(text)),
                self.emit("response.output_item.done", output_index=index, item=item)]

    def call(self, call: ToolCall) -> list[bytes]:
        events = self.close_message("completed")
        index, arguments = len(self.items), json.dumps(call.arguments, ensure_ascii=False)
        item = self.shape.call_item(call, arguments, "completed")
        self.items.append(item)
        where = {"item_id": item["id"], "output_index": index}
        return events + [
            self.emit("response.output_item.added", output_index=index, item=self.shape.call_item(call, "", "in_progress")),
            self.emit("response.function_call_arguments.delta", **where, delta=arguments),
            self.emit("response.function_call_arguments.done", **where, arguments=arguments),
            self.emit("response.output_item.done", output_index=index, item=item),
        ]


async def response_events(generation: Generation, shape: ResponseShape) -> AsyncIterator[bytes]:
    emit = EventStream()
    out = OutputEvents(shape, emit)
    tools = shape.inp.generation.tools
    calls = CallStream(tools) if tools is not None else None

    def feed(pieces: list[str | CallDelta]) -> list[bytes]:
        """Text pieces become deltas; a call is sent whole once CallStream has completed it."""
        assert calls is not None
        events = [e for piece in pieces if isinstance(piece, str) and piece for e in out.text(piece)]
        done = sum(1 for item in out.items if item["type"] == "function_call")
        return events + [e for call in calls.calls[done:] for e in out.call(call)]

    yield emit("response.created", response=shape.response("in_progress", []))
    yield emit("response.in_progress", response=shape.response("in_progress", []))
    if calls is None:  # plain text: the message opens at once
        for event in out.open_message():
            yield event
    async with aclosing(generation.text_batches()) as batches:
        try:
            async for texts in batches:
                for text in texts:
                    for event in (out.text(text) if calls is None else feed(calls.feed(text))):
                        yield event
        except GatewayError as error:
            for event in out.close_message("incomplete"):
                yield event
            yield emit("response.failed", response=shape.response("failed", out.items, error=error))
            return
    for event in feed(calls.finish()) if calls is not None else []:
        yield event
    status = shape.final_status()
    if out.is_empty:  # nothing at all was said: an empty message, as a whole answer has
        for event in out.open_message():
            yield event
    for event in out.close_message(status):
        yield event
    assert generation.usage is not None, "usage is set when the text iterator ends"
    yield emit(f"response.{status}", response=shape.response(status, out.items, generation.usage))


async def responses_response(generation: Generation, inp: ResponsesInput, receive: Receive) -> Response:
    shape = ResponseShape(generation, inp)
    if inp.generation.stream:
        return SSEResponse(response_events(generation, shape), generation.aclose)
    text = await collect_or_cancel(generation, receive)
    if text is None:
        return Response(status_code=CLIENT_CLOSED_REQUEST)
    assert generation.usage is not None, "usage is set when the text iterator ends"
    return JSONBytes(shape.whole(text, generation.usage))
