"""Baseline and subject measured in one run, in alternating rounds.

A shared machine's speed drifts with its neighbours' load, so a baseline measured a minute before
its subject is not a fair comparison. Every benchmark that compares two things calls `interleave`:
each round runs the baseline, then the subject, and the caller summarises the rounds of each side
(median, sum or pooled percentiles) knowing both saw the same machine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class Paired(Generic[T]):
    """Each side's result per round, in round order."""

    baseline: list[T]
    subject: list[T]


async def interleave(
    baseline: Callable[[], Awaitable[T]], subject: Callable[[], Awaitable[T]], rounds: int
) -> Paired[T]:
    """`rounds` times: one baseline measurement, then one subject measurement."""
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    paired: Paired[T] = Paired([], [])
    for _ in range(rounds):
        paired.baseline.append(await baseline())
        paired.subject.append(await subject())
    return paired
