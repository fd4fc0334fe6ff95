"""benchmarks/common.py: baseline and subject alternate, each side keeps its own rounds."""

from __future__ import annotations

import pytest

from benchmarks.common import interleave


async def test_rounds_alternate_baseline_first() -> None:
    calls: list[str] = []

    async def side(name: str) -> str:
        calls.append(name)
        return f"{name}{len(calls)}"

    paired = await interleave(lambda: side("b"), lambda: side("s"), 3)
    assert calls == ["b", "s"] * 3
    assert paired.baseline == ["b1", "b3", "b5"] and paired.subject == ["s2", "s4", "s6"]


async def test_at_least_one_round() -> None:
    async def nothing() -> None:
        return None

    with pytest.raises(ValueError, match="at least 1"):
        await interleave(nothing, nothing, 0)
