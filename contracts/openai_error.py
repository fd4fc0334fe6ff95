"""OpenAI's error body, which the gateway's `/ai/v1/` routes and every backend answer with."""

from __future__ import annotations

from typing import Any


def error_body(message: str, type_: str, code: int | str, param: str | None = None) -> dict[str, Any]:
    """`{"error": {message, type, param, code}}`; backends put the HTTP status in `code`, the
    gateway its Workers AI code as a string."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
