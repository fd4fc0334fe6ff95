"""The published input schema and the request parser agree: same fields, every bound accepted, and
one step past each bound refused."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidInput
from gateway.pipeline.model_schema import MESSAGES_INPUT, PROMPT_INPUT, SAMPLING
from gateway.pipeline.request_fields import WORKERS_AI, Treatment
from gateway.pipeline.schemas import parse_workers_ai


def test_the_schema_names_exactly_the_honoured_fields() -> None:
    described = set(PROMPT_INPUT["properties"]) | set(MESSAGES_INPUT["properties"])
    assert described == {name for name, rule in WORKERS_AI.items() if rule.treatment is Treatment.HONOURED}


def bounds() -> list[tuple[str, Any, bool]]:
    cases = []
    for name, field in SAMPLING.items():
        step = 1 if field["type"] == "integer" else 1e-6
        if "minimum" in field:
            cases += [(name, field["minimum"], True), (name, field["minimum"] - step, False)]
        if "exclusiveMinimum" in field:
            cases += [(name, field["exclusiveMinimum"], False), (name, field["exclusiveMinimum"] + step, True)]
        if "maximum" in field:
            cases += [(name, field["maximum"], True), (name, field["maximum"] + step, False)]
    return cases


@pytest.mark.parametrize(("name", "value", "accepted"), bounds())
def test_every_bound_in_the_schema_is_the_parsers(name: str, value: Any, accepted: bool) -> None:
    body = {"prompt": "x", name: value}
    if accepted:
        parse_workers_ai(body)
    else:
        with pytest.raises(InvalidInput):
            parse_workers_ai(body)


def test_defaults_in_the_schema_are_the_parsers() -> None:
    sampling = parse_workers_ai({"prompt": "x"}).sampling
    for name, field in SAMPLING.items():
        if "default" in field and name != "stream":
            assert getattr(sampling, name) == field["default"], name
