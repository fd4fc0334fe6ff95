"""The integers a JSON Schema for guided decoding may hold: those of a signed 64-bit integer.

Grammar libraries read a schema's numbers into 64-bit integers (llguidance through Rust's
serde_json; xgrammar in C++). Past that range llguidance raises while converting the schema
(`Value is not JSON serializable: 18446744073709551616`), and another library may fail or wrap
around. So one integer too wide anywhere in a schema (`minimum`, `enum`, `const`, even an
annotation such as `default`) is the request's fault: the gateway refuses it before forwarding
and the built-in backend checks again for callers that reach it directly, both with a message
that names where it is (`wide_integer`).
"""

from __future__ import annotations

import json
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def wide_integer(value: Any, root: str) -> str | None:
    """A message naming the first integer in `value` (a parsed schema, in document order) outside
    the signed 64-bit range, by its path from `root`; None when there is none."""
    stack: list[tuple[Any, str]] = [(value, root)]
    while stack:  # no recursion: a schema may nest as deep as its parser allowed
        item, path = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool) and not INT64_MIN <= item <= INT64_MAX:
            shown = str(item) if len(str(item)) <= 40 else f"an integer of {len(str(item))} digits"
            return (
                f"{path} is {shown}, outside the 64-bit integer range a schema may use "
                f"({INT64_MIN} to {INT64_MAX}): use a bound within it, or drop it"
            )
        if isinstance(item, dict):
            stack.extend((child, _key_path(path, key)) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in reversed(list(enumerate(item))))
    return None


def _key_path(path: str, key: str) -> str:
    return f"{path}.{key}" if key.isidentifier() else f"{path}[{json.dumps(key, ensure_ascii=False)}]"
