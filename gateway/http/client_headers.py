"""The client's headers that the gateway reads: `x-session-affinity` and `cf-aig-metadata` (kept in the
ledger), and AI Gateway's cache headers (`cache_directive`; gateway/pipeline/answer_cache.py says
what they do).

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
from gateway.pipeline.answer_cache import MAX_TTL_S, CacheDirective, clamp_ttl

SESSION_HEADER = "x-session-affinity"
MAX_SESSION_CHARS = 256
METADATA_HEADER = "cf-aig-metadata"
MAX_METADATA_ENTRIES = 5
MAX_METADATA_BYTES = 2048
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 256
MAX_METADATA_INT = 2**53
CACHE_TTL_HEADERS = ("cf-aig-cache-ttl", "cf-cache-ttl")  # AI Gateway's name, then its old one
SKIP_CACHE_HEADERS = ("cf-aig-skip-cache", "cf-skip-cache")
CACHE_KEY_HEADER = "cf-aig-cache-key"
MAX_CACHE_KEY_CHARS = 1024


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


def _first(request: Request, names: tuple[str, ...]) -> tuple[str, str] | None:
    for name in names:
        value = request.headers.get(name)
        if value is not None:
            return name, value
    return None


_CACHE_HEADERS = frozenset(name.encode() for name in (*CACHE_TTL_HEADERS, *SKIP_CACHE_HEADERS, CACHE_KEY_HEADER))


def cache_directive(request: Request) -> CacheDirective | None:
    """What the request asks of the response cache; None when it sends none of its headers (found in
    one pass over the raw headers, which ASGI gives lower-cased: most requests send none)."""
    if _CACHE_HEADERS.isdisjoint(dict(request.scope["headers"])):
        return None
    ttl = _first(request, CACHE_TTL_HEADERS)
    skip = _first(request, SKIP_CACHE_HEADERS)
    key = header_text(request, CACHE_KEY_HEADER)
    if ttl is None and skip is None and key is None:
        return None
    ttl_s = None
    if ttl is not None:
        name, value = ttl
        if not value.strip().isdigit() or int(value) < 1:
            raise InvalidInput(f"{name} must be a whole number of seconds (60 to {MAX_TTL_S}), got {value!r}",
                               param=name)
        ttl_s = clamp_ttl(int(value))
    skipping = False
    if skip is not None:
        name, value = skip
        if value.strip().lower() not in ("true", "false"):
            raise InvalidInput(f"{name} must be true or false, got {value!r}", param=name)
        skipping = value.strip().lower() == "true"
    if key is not None and not 0 < len(key) <= MAX_CACHE_KEY_CHARS:
        raise InvalidInput(f"{CACHE_KEY_HEADER} must be 1 to {MAX_CACHE_KEY_CHARS} characters", param=CACHE_KEY_HEADER)
    return CacheDirective(ttl_s, skipping, key)
