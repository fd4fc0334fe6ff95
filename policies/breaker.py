"""Outlier ejection of one backend: a circuit breaker with a half-open probe (pure transitions).

Three states, as in Envoy's outlier detection and the classic circuit breaker:

- closed: the backend takes traffic. Each failure (refused, reset, timed out before the first
  byte, or a stream broken midway) adds one to `consecutive_failures`; a completed request sets
  it back to 0. At `failure_threshold` consecutive failures the breaker opens.
- open: the backend is ejected (no routing candidate) until `open_until`. Its n-th ejection in a
  row lasts `ejection_s * 2**(n-1)`, capped at `max_ejection_s`, so a flapping backend is kept out
  longer each time it fails again.
- half_open: the ejection has run out and a probe (the gateway's health check) passed: the backend
  takes traffic again on trial, one request at a time (`begin_trial`: a second one while the first
  is under way goes elsewhere, until the first ends or `trial_timeout_s` passes). Its next
  completed request closes the breaker (and forgets the ejections); its next failure opens it
  again, for the next, longer ejection. A failed probe while open re-opens it the same way.

Overloaded (429) and refused (4xx) answers are neither failures nor successes: a busy backend
is healthy, and a bad request says nothing about the backend. Time is the caller's (`now`, in
seconds on any monotonic clock), so every transition is a pure function of its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from policies.errors import PolicyConfigError

BreakerStatus = Literal["closed", "open", "half_open"]


@dataclass(slots=True, frozen=True)
class BreakerConfig:
    failure_threshold: int = 3  # consecutive failures that eject a backend
    ejection_s: float = 5.0  # the first ejection; each further one in a row doubles it
    max_ejection_s: float = 60.0
    trial_timeout_s: float = 30.0  # a trial request that never reports back frees the trial after this

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise PolicyConfigError(f"failure_threshold must be >= 1, not {self.failure_threshold}")
        if not 0 < self.ejection_s <= self.max_ejection_s:
            raise PolicyConfigError(
                f"need 0 < ejection_s ({self.ejection_s}) <= max_ejection_s ({self.max_ejection_s})"
            )

    def ejection_for(self, num_ejections: int) -> float:
        """How long the `num_ejections`-th ejection in a row lasts (1 for the first)."""
        return min(self.max_ejection_s, self.ejection_s * 2.0 ** min(num_ejections - 1, 32))


@dataclass(slots=True, frozen=True)
class Breaker:
    status: BreakerStatus = "closed"
    consecutive_failures: int = 0
    num_ejections: int = 0  # ejections in a row, since the breaker last closed
    open_until: float = 0.0  # when status is "open": the ejection's end
    trial_since: float | None = None  # when status is "half_open": the trial request's start, if one runs

    def admits(self) -> bool:
        """Whether the backend is a routing candidate now (closed, or half-open on trial)."""
        return self.status != "open"

    def may_probe(self, now: float) -> bool:
        """Whether an ejected backend's ejection has run out, so a probe may decide its fate."""
        return self.status == "open" and now >= self.open_until


def _eject(breaker: Breaker, config: BreakerConfig, now: float) -> Breaker:
    num = breaker.num_ejections + 1
    return Breaker("open", breaker.consecutive_failures, num, now + config.ejection_for(num))


def begin_trial(breaker: Breaker, config: BreakerConfig, now: float) -> tuple[bool, Breaker]:
    """Whether one more request may be sent to the backend now, and the breaker after sending it:
    always when closed, never when open, one at a time when half-open."""
    if breaker.status == "closed":
        return True, breaker
    if breaker.status == "open":
        return False, breaker
    if breaker.trial_since is not None and now - breaker.trial_since < config.trial_timeout_s:
        return False, breaker
    return True, replace(breaker, trial_since=now)


def on_success(breaker: Breaker) -> Breaker:
    """A request on the backend completed: closed again, its failures and ejections forgotten."""
    if breaker.status == "open":  # a request that was already under way when it was ejected
        return breaker
    return Breaker()


def on_failure(breaker: Breaker, config: BreakerConfig, now: float) -> Breaker:
    """A request on the backend failed (before its first byte, or its stream broke)."""
    if breaker.status == "open":
        return breaker  # already out; requests sent before the ejection are still failing
    failed = replace(breaker, consecutive_failures=breaker.consecutive_failures + 1)
    if breaker.status == "half_open" or failed.consecutive_failures >= config.failure_threshold:
        return _eject(failed, config, now)
    return failed


def on_probe(breaker: Breaker, config: BreakerConfig, now: float, *, passed: bool) -> Breaker:
    """A health probe answered. It only matters once an ejection has run out: passed lets the
    backend back on trial (half-open), failed ejects it again for longer."""
    if not breaker.may_probe(now):
        return breaker
    if passed:
        return replace(breaker, status="half_open", consecutive_failures=0)
    return _eject(breaker, config, now)
