"""Reading a JSON request body with a size bound that holds before the body is read."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from gateway.errors import IncompleteRequest, InvalidInput, RequestTooLarge
from gateway.http.strict_json import JSONRejected, loads_strict
from gateway.pipeline.offload import Offload, is_large


def _too_large(max_bytes: int) -> RequestTooLarge:
    return RequestTooLarge(f"Request is too large: the body may be at most {max_bytes} bytes")


async def read_bounded(request: Request, max_bytes: int) -> bytes:
    """The whole body, refused (413) before reading when its declared length is over `max_bytes`, and as
    soon as the bytes read pass it (the rest is never buffered)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_json_object(
    request: Request, max_bytes: int, *, allow_empty: bool = False, offload: Offload | None = None
) -> dict[str, Any]:
    """The body as a JSON object (an empty body is `{}` when `allow_empty`).

    A declared Content-Length over `max_bytes` is refused before reading anything; a chunked
    body is refused as soon as the bytes read pass the bound (the rest is never buffered). A large
    body is parsed on `offload`'s threads when given.
    """
    raw = await read_bounded(request, max_bytes)
    size = len(raw)
    if size == 0:
        if allow_empty:
            return {}
        raise IncompleteRequest("Request is missing headers or body: send a JSON object body")
    try:
        if offload is None or not is_large(size):  # inline: no closure, no coroutine more
            body = loads_strict(raw)
        else:
            body = await offload.run(lambda: loads_strict(raw))
    except JSONRejected as exc:
        raise InvalidInput(f"the body is rejected: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidInput(f"the body must be a JSON object, got {type(body).__name__}")
    return body
