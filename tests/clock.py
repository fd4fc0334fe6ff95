"""A clock a test moves by hand (`clock.now += 5`), for code that takes `clock: Callable[[], float]`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now
