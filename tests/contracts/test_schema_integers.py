from __future__ import annotations

from typing import Any

import pytest

from contracts.schema_integers import INT64_MAX, INT64_MIN, wide_integer


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ({"type": "integer", "minimum": 2**64}, "s.minimum"),
        ({"maximum": INT64_MAX + 1}, "s.maximum"),
        ({"enum": [1, "x", INT64_MIN - 1]}, "s.enum[2]"),
        ({"const": -(2**70)}, "s.const"),
        ({"properties": {"a b": {"default": 2**64}}}, 's.properties["a b"].default'),
        ({"anyOf": [{"type": "string"}, {"items": {"examples": [[2**100]]}}]}, "s.anyOf[1].items.examples[0][0]"),
        ({"minimum": 2**64, "maximum": 2**65}, "s.minimum"),  # the first in document order
    ],
)
def test_an_integer_past_64_bits_is_named_by_its_path(schema: dict[str, Any], path: str) -> None:
    message = wide_integer(schema, "s")
    assert message is not None and message.startswith(f"{path} is ")


@pytest.mark.parametrize(
    "schema",
    [{"minimum": INT64_MIN, "maximum": INT64_MAX}, {"enum": [True, 1.5e300, "18446744073709551616"]}, {}, True],
)
def test_64_bit_integers_floats_booleans_and_strings_pass(schema: Any) -> None:
    assert wide_integer(schema, "s") is None


def test_a_huge_integer_is_not_echoed_whole() -> None:
    message = wide_integer({"const": 10**500}, "s")
    assert message is not None and "an integer of 501 digits" in message and len(message) < 200
