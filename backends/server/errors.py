"""HTTP errors of the backend, all rendered in OpenAI's shape, and the handlers that map to them.

    {"error": {"message": "...", "type": "...", "param": "..." | null, "code": <status>}}

    ValidationError (pydantic), malformed JSON -> 400 invalid_request_error
    engines.errors.InvalidRequest             -> 400 invalid_request_error
    ModelNotFound                             -> 404 not_found_error
    engines.errors.EngineOverloaded, Overloaded (admission) -> 429 + Retry-After
    NotImplementedFeature (a disaggregated step without KV transfer here) -> 501
    disagg.KVPinGone (the context step's KV expired or was pulled)       -> 410
    disagg.KVTransferFailed (the context backend is unreachable)        -> 502
    engines.errors.EngineStopped, Unavailable (starting / draining) -> 503
    engines.errors.EngineError (anything else), any other exception -> 500 internal_error
"""

from __future__ import annotations

import logging

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from contracts.openai_error import error_body
from engines.errors import AdapterNotFound, EngineError, EngineOverloaded, EngineStopped, InvalidRequest

log = logging.getLogger(__name__)

RETRY_AFTER_S = 1  # what 429 and 503 answers suggest; the gateway's own backoff decides


class APIError(Exception):
    status = 500
    type = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequest(APIError):
    status, type = 400, "invalid_request_error"


class ModelNotFound(APIError):
    status, type = 404, "not_found_error"


class Overloaded(APIError):
    status, type = 429, "rate_limit_error"


class NotImplementedFeature(APIError):
    status, type = 501, "not_implemented_error"


class Unavailable(APIError):
    status, type = 503, "service_unavailable_error"


def error_response(error: APIError) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_S)} if error.status in (429, 503) else None
    return JSONResponse(error_body(error.message, error.type, error.status, error.param), error.status, headers=headers)


def from_engine_error(exc: EngineError) -> APIError:
    """The HTTP error for an engine error (engines.errors)."""
    if isinstance(exc, AdapterNotFound):
        return ModelNotFound(str(exc), param="model")
    if isinstance(exc, InvalidRequest):
        return BadRequest(str(exc))
    if isinstance(exc, EngineOverloaded):
        return Overloaded(str(exc))
    if isinstance(exc, EngineStopped):
        return Unavailable(str(exc))
    log.error("engine error: %s", exc)
    return APIError(f"generation failed: {exc}")


def from_validation_error(exc: ValidationError) -> BadRequest:
    """The first problem pydantic found, with the offending field as `param`."""
    first = exc.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return BadRequest(f"{location}: {message}" if location else message, param=location or None)


async def handle_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc)


async def handle_validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ValidationError)
    return error_response(from_validation_error(exc))


async def handle_engine_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EngineError)
    return error_response(from_engine_error(exc))


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    """A bug: answer in OpenAI's shape (Starlette re-raises it afterwards, so it is logged)."""
    return error_response(APIError(f"internal error: {type(exc).__name__}"))


EXCEPTION_HANDLERS = {
    APIError: handle_api_error,
    ValidationError: handle_validation_error,
    EngineError: handle_engine_error,
    Exception: handle_unexpected,
}
