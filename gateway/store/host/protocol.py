"""The store host's wire format: length-prefixed JSON frames over a Unix socket.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON (never pickle: the
socket must not be a way to run code): an array of messages, the calls (or replies) one side had
ready at once, so a batch costs one parse and one write however many calls it holds. A worker
sends requests `[call_id, method, args, kwargs]`; the host answers `[call_id, "ok", value]` or
`[call_id, error_kind, message]`, in any order (the call id pairs them). Only the methods in
`METHODS` can be called. Errors travel by the name of the store's own exception
(`gateway.store.errors`), so a worker raises what the in-process store would have raised.
"""

from __future__ import annotations

import json
import json.encoder
import json.scanner
from collections.abc import Callable
from typing import Any, cast

from gateway.store import errors
from gateway.store.host.codec import to_json

MAX_FRAME = 8 * 1024 * 1024  # bytes of JSON in one frame, either way (a ledger page is ~0.3 MB)
_HEADER = 4

# The host's allow-list: every `Store` method but `iter_usage` (read as `usage_page` calls) and
# `aclose` (closing the connection is the worker's close).
METHODS = frozenset({
    "create_tenant", "get_tenant", "get_tenant_by_account", "list_tenants",
    "create_key", "lookup_key", "get_key", "list_keys", "revoke_key",
    "check_and_consume", "reconcile_tokens", "acquire_request_slot", "release_request_slot",
    "reserve_budget", "settle_budget", "budget_spent",
    "get_session", "set_session", "delete_session",
    "record_prefix", "remove_prefix", "match_prefix",
    "add_inflight", "release_inflight", "correct_inflight", "loads",
    "append_usage", "get_usage", "usage_page", "get_or_create_secret", "archive_ledger",
})  # fmt: skip

OK = "ok"
BAD_REQUEST = "BadRequest"  # a malformed request, an unknown method or wrong arguments: a bug, not bad input
# The exceptions that keep their type across the socket, by name. TokensOverLimit carries [tokens, tpm].
_ERRORS: dict[str, type[errors.StoreError]] = {
    cls.__name__: cls
    for cls in (
        errors.InvalidArgument, errors.TokensOverLimit, errors.Conflict, errors.NotFound,
        errors.StoreUnavailable, errors.StoreFull, errors.StoreError,
    )
}  # fmt: skip

# The json module's C encoder and scanner called directly: `JSONEncoder.encode` builds a new C
# encoder per call and `JSONDecoder.decode` runs two regexes around the scan, 2.4 + 1.4 us per frame
# (2-core VM), paid per batch on both sides. Same output; no cycle check (store values have none).
_encoder = json.JSONEncoder(separators=(",", ":"), default=to_json)
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)  # None where _json is missing
_c_encode: Any = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(None, to_json, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
)
_scan: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(cast(Any, json.JSONDecoder()))


def _dumps(value: Any) -> str:
    try:
        return "".join(_c_encode(value, 0)) if _c_encode is not None else _encoder.encode(value)
    except RecursionError as exc:  # nested too deep (or a cycle): not a message
        raise ValueError(f"a message nests too deep: {exc}") from exc


def _loads(text: str) -> Any:
    """The one JSON value `text` holds; ValueError otherwise (leading or trailing bytes included)."""
    try:
        value, end = _scan(text, 0)
    except StopIteration as exc:  # the scanner's "no value here"
        raise ValueError(f"no JSON value at {exc.value}") from None
    except RecursionError as exc:  # arrays nested thousands deep
        raise ValueError(f"JSON nested too deep: {exc}") from None
    if end != len(text):
        raise ValueError(f"extra data at {end}")
    return value


class ProtocolError(Exception):
    """A frame that breaks the format (too long, not JSON, not an array): the connection cannot go on."""


def frame(messages: list[Any]) -> bytes:
    """`messages` as one frame, in one encoding pass; TypeError (not JSON) or ValueError (too long)."""
    body = _dumps(messages).encode()
    if len(body) > MAX_FRAME:
        raise ValueError(f"{len(messages)} messages of {len(body)} bytes exceed the frame limit of {MAX_FRAME}")
    return len(body).to_bytes(_HEADER, "big") + body


def frame_each(messages: list[Any], failed: Callable[[Any, Exception], Any | None]) -> bytes:
    """`messages` in frames as large as fit, encoded one by one: a message that is not JSON or too
    long on its own is replaced by `failed(message, error)` (None: left out). The path for a batch
    that `frame` refused."""
    encoded = []
    for message in messages:
        try:
            data = _dumps(message).encode()
            if len(data) + 2 > MAX_FRAME:
                raise ValueError(f"a message of {len(data)} bytes exceeds the frame limit of {MAX_FRAME}")
        except (TypeError, ValueError) as exc:
            replacement = failed(message, exc)
            if replacement is None:
                continue
            data = _dumps(replacement).encode()
        encoded.append(data)
    out: list[bytes] = []
    batch: list[bytes] = []
    size = 2
    for data in encoded:
        if batch and size + len(data) + 1 > MAX_FRAME:
            out.append(_joined(batch, size))
            batch, size = [], 2
        batch.append(data)
        size += len(data) + 1
    if batch:
        out.append(_joined(batch, size))
    return b"".join(out)


def _joined(batch: list[bytes], size: int) -> bytes:
    return (size - 1).to_bytes(_HEADER, "big") + b"[" + b",".join(batch) + b"]"


class FrameReader:
    """Splits a byte stream into the messages of its complete frames."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []  # the start of a frame not complete yet
        self._size = 0  # their bytes
        self._need = _HEADER  # bytes that complete it (the header, then the whole frame once known)

    def feed(self, data: bytes) -> list[Any]:
        """The messages completed by `data` (the rest is kept); ProtocolError on a broken frame.
        A frame arriving in many reads is joined once, when complete."""
        if self._chunks:
            self._chunks.append(data)
            self._size += len(data)
            if self._size < self._need:
                return []
            data = b"".join(self._chunks)
            self._chunks = []
        messages: list[Any] = []
        pos, size = 0, len(data)
        need = _HEADER
        while size - pos >= _HEADER:
            length = int.from_bytes(data[pos : pos + _HEADER], "big")
            if length > MAX_FRAME:
                raise ProtocolError(f"a frame of {length} bytes exceeds the limit of {MAX_FRAME}")
            end = pos + _HEADER + length
            if end > size:
                need = _HEADER + length
                break
            try:
                batch = _loads(data[pos + _HEADER : end].decode())
            except ValueError as exc:  # bad UTF-8 or JSON
                raise ProtocolError(f"a frame is not JSON: {exc}") from exc
            if not isinstance(batch, list):
                raise ProtocolError("a frame must hold an array of messages")
            messages += batch
            pos = end
        if pos < size:
            self._chunks = [data[pos:]]
            self._size = size - pos
            self._need = need
        return messages


def error_reply(call_id: int, exc: BaseException) -> list[Any]:
    """The reply that makes the worker raise `exc`'s kind (unknown exceptions: a BadRequest)."""
    if isinstance(exc, errors.TokensOverLimit):
        return [call_id, "TokensOverLimit", [exc.tokens, exc.tpm]]
    kind = type(exc).__name__
    if kind in _ERRORS and isinstance(exc, errors.StoreError):
        return [call_id, kind, str(exc)]
    return [call_id, BAD_REQUEST, f"{kind}: {exc}"]


def raised(kind: str, detail: Any) -> errors.StoreError:
    """The exception a worker raises for an error reply."""
    if kind == "TokensOverLimit":
        tokens, tpm = detail
        return errors.TokensOverLimit(tokens, tpm)
    cls = _ERRORS.get(kind)
    if cls is not None:
        return cls(detail)
    return errors.StoreError(f"the store host refused a call ({kind}): {detail}")
