"""gateway.http.strict_json: the JSON that `json.loads` accepts but nothing downstream can use."""

from __future__ import annotations

import pytest

from gateway.http.strict_json import MAX_DEPTH, JSONRejected, loads_strict


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("NaN", "NaN"),
        ('{"temperature": Infinity}', "Infinity"),
        ('{"x": [-Infinity]}', "-Infinity"),
        ('{"prompt": "\\ud800"}', "surrogate"),
        ('{"\\udc00": 1}', "surrogate"),  # keys too
        ("[" * 100_000 + "]" * 100_000, "nests"),  # RecursionError inside the decoder
        ('{"a":' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1), "nests"),  # parses, but too deep
        ("{", "not valid JSON"),
        (b"\xff\xfe", "JSON"),
    ],
)
def test_refused_with_a_reason(text: str | bytes, why: str) -> None:
    with pytest.raises(JSONRejected, match=why):
        loads_strict(text)


def test_ordinary_json_passes_unchanged() -> None:
    body = '{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi \\ud83d\\ude00"}]}], "top_p": 0.5}'
    assert loads_strict(body) == {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi \N{GRINNING FACE}"}]}],
        "top_p": 0.5,
    }
    deep = '{"a":' * (MAX_DEPTH - 1) + "1" + "}" * (MAX_DEPTH - 1)
    assert loads_strict(deep) is not None
