"""contracts.usage: the one Usage, from a backend's JSON to the gateway's answer."""

from __future__ import annotations

import pytest

from contracts.usage import InvalidUsage, Usage


def test_bad_usage_is_refused() -> None:  # moved from tests/policies/test_pricing.py with the type
    with pytest.raises(InvalidUsage, match="exceeds"):
        Usage(10, 0, cached_tokens=11)
    with pytest.raises(InvalidUsage, match="non-negative"):
        Usage(-1, 0)
    with pytest.raises(InvalidUsage, match="non-negative"):
        Usage(1.0, 0)  # type: ignore[arg-type]


def test_wire_shape_round_trips() -> None:
    usage = Usage(10, 3, 4)
    assert Usage.from_json(usage.as_dict()) == usage
    assert usage.as_dict()["total_tokens"] == 13


def test_a_backends_odd_report_is_clamped_not_refused() -> None:
    assert Usage.from_json({"prompt_tokens": 5, "completion_tokens": -1, "prompt_tokens_details": {"cached_tokens": 9}}) == Usage(5, 0, 5)
    assert Usage.from_json({"prompt_tokens": 2, "completion_tokens": 1, "prompt_tokens_details": None}) == Usage(2, 1, 0)
