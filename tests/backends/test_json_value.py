"""The backend client's event decoder (`_json_value`) is `json.loads`: the same value or the same error
for every text, including the ones its fast path hands over (whitespace, a byte-order mark, trailing data)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.client.client import _json_value

values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


def _outcome(decode: object, text: str) -> tuple[str, str]:
    try:
        return "value", repr(decode(text))  # type: ignore[operator]
    except ValueError as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize(
    "text",
    [
        '{"a":1}',
        ' {"a":1}',
        '{"a":1}\n',
        '{"a":1}x',
        '{"a":1}{}',
        "",
        " ",
        "nul",
        "\ufeff{}",
        "[1,2",
        "NaN",
        '"\\ud800"',
    ],
)
def test_edge_texts_decode_as_json_loads_does(text: str) -> None:
    assert _outcome(_json_value, text) == _outcome(json.loads, text)


@settings(max_examples=300, deadline=None)
@given(value=values, before=st.sampled_from(["", " ", "\n"]), after=st.sampled_from(["", " ", "x", "}", "1"]))
def test_any_value_decodes_as_json_loads_does(value: object, before: str, after: str) -> None:
    text = before + json.dumps(value) + after
    assert _outcome(_json_value, text) == _outcome(json.loads, text)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet='{}[]":,0123456789.eE+-tfnaulrsNIy \\', max_size=24))
def test_arbitrary_text_decodes_as_json_loads_does(text: str) -> None:
    assert _outcome(_json_value, text) == _outcome(json.loads, text)
