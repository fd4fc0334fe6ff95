"""JSON from clients, parsed strictly: what Python's `json` lets through but nothing downstream can use.

`json.loads` accepts `NaN` and `Infinity` (not JSON: they break range checks, the ledger and
exports) and turns a number too large for a float (`1e999`) into infinity too, lone UTF-16
surrogates such as `"\\ud800"` (valid escapes, but no UTF-8 text: the tokenizer and every encoder
fail on them), and nesting as deep as the stack allows (a body nested
100,000 levels raises RecursionError here or later, in validation or when the ledger encodes it).
`loads_strict` refuses all three with `JSONRejected`, whose message says what to fix; callers turn
it into their own 400. With `unique_keys`, an object naming a key twice is refused too (`json.loads`
keeps the last value without a word), for headers where a collapsed key would lose what a client sent.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 32  # Workers AI bodies nest 4 levels (messages -> content parts -> fields)


class JSONRejected(ValueError):
    """The text is not strict JSON; the message says why."""


def _no_constants(name: str) -> Any:
    raise JSONRejected(f"{name} is not a JSON number: send a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JSONRejected(f"{text[:40]} is too large for a number: send a finite number")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise JSONRejected(f"the key {key!r} appears more than once: send each key once")
        found[key] = value
    return found


# json.loads with these hooks would build a decoder per call (a measurable part of each request)
_DECODER = json.JSONDecoder(parse_constant=_no_constants, parse_float=_finite_float)
_UNIQUE_DECODER = json.JSONDecoder(
    parse_constant=_no_constants, parse_float=_finite_float, object_pairs_hook=_unique_keys
)


def _decode(data: bytes | str, decoder: json.JSONDecoder) -> Any:
    """`json.loads(data, ...)` with the hooks above: the same encoding detection and BOM rule."""
    if isinstance(data, str):
        if data.startswith("\ufeff"):
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
    else:
        data = data.decode(json.detect_encoding(data), "surrogatepass")
    return decoder.decode(data)


def loads_strict(data: bytes | str, max_depth: int = MAX_DEPTH, *, unique_keys: bool = False) -> Any:
    """Parse `data`; raise JSONRejected for invalid JSON, NaN/Infinity, lone surrogates or deep nesting
    (and, with `unique_keys`, for an object naming a key twice)."""
    try:
        value = _decode(data, _UNIQUE_DECODER if unique_keys else _DECODER)
    except JSONRejected:
        raise
    except RecursionError:
        raise JSONRejected(f"the JSON nests too deeply: at most {max_depth} levels") from None
    except UnicodeDecodeError:
        raise JSONRejected("the body must be UTF-8 encoded JSON") from None
    except ValueError as exc:
        raise JSONRejected(f"not valid JSON: {exc}") from None
    check_value(value, max_depth)
    return value


def check_value(value: Any, max_depth: int = MAX_DEPTH) -> None:
    """Walk `value` without recursion: bounded depth, and every string (keys too) encodable as UTF-8."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _check_text(item)
        elif isinstance(item, (dict, list)):
            if depth > max_depth:
                raise JSONRejected(f"the JSON nests too deeply: at most {max_depth} levels")
            if isinstance(item, dict):
                for key, child in item.items():
                    _check_text(key)
                    stack.append((child, depth + 1))
            else:
                stack.extend((child, depth + 1) for child in item)


def _check_text(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise JSONRejected(
            "a string holds a lone UTF-16 surrogate (such as \\ud800) that is not text: send valid Unicode"
        ) from None
