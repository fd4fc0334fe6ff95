"""The client's headers that the gateway keeps in the ledger: `x-session-affinity` and `cf-aig-metadata`.

HTTP carries header values as bytes and Starlette decodes them as latin-1, so UTF-8 text ("zoë")
would be stored as mojibake ("zoÃ«"). Both headers are read as UTF-8 here (anything else is a
400 naming the header), and their length limits count characters.

`cf-aig-metadata` is AI Gateway's: a JSON object of up to 5 entries whose values are strings,
numbers or booleans. It documents no size, so ours are bounded too: the header at most
MAX_METADATA_BYTES, keys at most MAX_METADATA_KEY characters, strings at most MAX_METADATA_VALUE,
integers within +-2^53 (exact in every JSON reader), each key once. Everything else is a 400 that
says what to fix, never stored.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from gateway.errors import InvalidInput
from gateway.http.strict_json import JSONRejected, loads_strict

SESSION_HEADER = "x-session-affinity"
MAX_SESSION_CHARS = 256
METADATA_HEADER = "cf-aig-metadata"
MAX_METADATA_ENTRIES = 5
MAX_METADATA_BYTES = 2048
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 256
MAX_METADATA_INT = 2**53


def header_text(request: Request, name: str) -> str | None:
    """The header's value read as UTF-8 text; None when absent."""
    value = request.headers.get(name)
    if value is None:
        return None
    try:
        return value.encode("latin-1").decode("utf-8")  # back to the bytes sent, then as UTF-8
    except UnicodeDecodeError:
        raise InvalidInput(f"{name} is not valid UTF-8: send UTF-8 text", param=name) from None


def session_id(request: Request) -> str | None:
    value = header_text(request, SESSION_HEADER)
    if value is None:
        return None
    if not 0 < len(value) <= MAX_SESSION_CHARS:
        raise InvalidInput(f"{SESSION_HEADER} must be 1 to {MAX_SESSION_CHARS} characters", param=SESSION_HEADER)
    return value


def metadata(request: Request) -> dict[str, Any]:
    """`cf-aig-metadata` + our ids (the client's `x-request-id`, when it sent one)."""
    found: dict[str, Any] = {}
    raw = header_text(request, METADATA_HEADER)
    if raw is not None:
        found = parse_metadata(raw)
    client_request_id = request.state.client_request_id
    if client_request_id is not None:
        found = {**found, "client_request_id": client_request_id}
    return found


def parse_metadata(raw: str) -> dict[str, Any]:
    """The header's object, or InvalidInput saying what to fix."""
    hint = f"send a flat JSON object of at most {MAX_METADATA_ENTRIES} string, number or boolean values"

    def refuse(problem: str) -> InvalidInput:
        return InvalidInput(f"{METADATA_HEADER}: {problem}", param=METADATA_HEADER)

    if len(raw.encode("utf-8", "surrogatepass")) > MAX_METADATA_BYTES:
        raise refuse(f"the header may be at most {MAX_METADATA_BYTES} bytes")
    try:
        found = loads_strict(raw, max_depth=1, unique_keys=True)
    except JSONRejected as exc:
        raise refuse(f"{exc}; {hint}") from None
    if not isinstance(found, dict) or len(found) > MAX_METADATA_ENTRIES:
        raise refuse(hint)
    for key, value in found.items():
        if len(key) > MAX_METADATA_KEY:
            raise refuse(f"keys may be at most {MAX_METADATA_KEY} characters")
        if not isinstance(value, (str, int, float, bool)):
            raise refuse(f"values must be strings, numbers or booleans: {hint}")
        if isinstance(value, str) and len(value) > MAX_METADATA_VALUE:
            raise refuse(f"string values may be at most {MAX_METADATA_VALUE} characters")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_METADATA_INT:
            raise refuse("integers must lie within +-2^53")
    return found
