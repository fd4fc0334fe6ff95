"""The JSON bodies the gateway answers with: Workers AI envelopes and OpenAI objects.

Pure functions from plain values to dicts (and compact JSON bytes), so every wire shape is
written once and tested without HTTP.
"""

from __future__ import annotations

import math
import struct
from base64 import b64encode
from typing import Any

from starlette.responses import Response

from contracts.openai_error import error_body
from contracts.sse import dumps
from contracts.usage import Usage
from gateway.errors import GatewayError


class JSONBytes(Response):
    """A JSON response rendered with our compact encoder."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


# ---- Workers AI -------------------------------------------------------------------------------


def workers_ai_success(result: Any, messages: list[Any] | None = None) -> dict[str, Any]:
    return {"result": result, "success": True, "errors": [], "messages": messages or []}


def workers_ai_error(error: GatewayError) -> dict[str, Any]:
    return {
        "result": None,
        "success": False,
        "errors": [{"code": error.code, "message": error.message}],
        "messages": [],
    }


def workers_ai_text_result(
    response: Any, usage: Usage, tool_calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """`response` is the text, or in JSON mode the parsed object; `tool_calls` [{name, arguments}]."""
    result: dict[str, Any] = {"response": response}
    if tool_calls:
        result["tool_calls"] = tool_calls
    result["usage"] = usage.as_dict()
    return result


# ---- OpenAI -----------------------------------------------------------------------------------


def workers_ai_embeddings(vectors: list[list[float]]) -> dict[str, Any]:
    """Workers AI's text-embeddings result: `shape` [texts, dimensions] and the vectors."""
    return {"shape": [len(vectors), len(vectors[0]) if vectors else 0], "data": vectors}


def openai_embeddings(model: str, vectors: list[list[float]], usage: Usage, *, base64: bool) -> dict[str, Any]:
    """OpenAI's embeddings list; `base64`: each vector as little-endian float32 bytes, base64-encoded."""
    encoded: list[Any] = [_base64_floats(v) for v in vectors] if base64 else vectors
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": vector} for i, vector in enumerate(encoded)],
        "model": model,
        "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.total_tokens},
    }


def _base64_floats(vector: list[float]) -> str:
    return b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def openai_error(error: GatewayError) -> dict[str, Any]:
    return error_body(error.message, error.openai_type, str(error.code), error.param)


def chat_completion(
    completion_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    usage: Usage,
    tool_calls: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:  # OpenAI: content is null when the answer is only calls
        message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
        finish_reason = "tool_calls"
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason or "stop",
            }
        ],
        "usage": usage.as_dict(),
    }


def text_completion(
    completion_id: str, created: int, model: str, text: str, finish_reason: str | None, usage: Usage
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason or "stop"}],
        "usage": usage.as_dict(),
    }


def error_response(error: GatewayError, *, openai: bool) -> JSONBytes:
    """The HTTP response for an error, in the shape of the API the client called."""
    headers: dict[str, str] = {}
    if error.retry_after_s is not None:
        headers["retry-after"] = str(max(1, math.ceil(error.retry_after_s)))
    body = openai_error(error) if openai else workers_ai_error(error)
    return JSONBytes(body, status_code=error.status, headers=headers)
