"""Outlier ejection of one backend: a circuit breaker with a half-open probe (pure transitions).

Three states, as in Envoy's outlier detection and the classic circuit breaker:

- closed: the backend takes traffic. Failures since the last completed request form a streak,
  and the breaker opens when the streak holds `failure_threshold` failures that are the
  backend's own (the rule below). A completed request ends the streak.
- open: the backend is ejected (no routing candidate) until `open_until`. Its n-th ejection in a
  row lasts `ejection_s * 2**(n-1)`, capped at `max_ejection_s`, so a flapping backend is kept out
  longer each time it fails again.
- half_open: the ejection has run out and a probe (the gateway's health check) passed: the backend
  takes traffic again on trial, one request at a time until it answers (`begin_trial`: a second
  one while the first waits for its first byte goes elsewhere, until the first gets it or ends, or
  `trial_timeout_s` passes). Its next completed request closes the breaker (and forgets the
  ejections); its next failure that is the backend's own opens it again, for the next, longer
  ejection, whichever request it comes from. A trial request whose backend answered its first
  byte, or that ends saying nothing about the backend (its client left before any token, a 429, a
  4xx, one tenant's failed answer), gives the trial back at once (`end_trial`), so that another
  request can be the trial: a long stream does not hold the backend for everyone else. A failed
  probe while open re-opens it the same way.

Whose failure it is. A backend must not be ejected because of what one tenant sends: a request
whose content makes the backend fail (a schema its grammar library chokes on, say) would
otherwise take the model offline for every tenant, at no cost to the sender. So failures are of
two kinds, told apart by the caller:

- a connection failure (refused, reset, timed out, before or during the answer) happened before
  the backend read the request, or is the backend failing to talk at all: it always counts,
  so a backend that is down is ejected after `failure_threshold` requests, even with one tenant
  sending them;
- a failed answer (a 5xx status, an error event or a broken payload in the stream) may be caused by
  the request itself: it counts once per tenant (`tenant`), and never alone: the streak opens the
  breaker only when it also holds a connection failure or failed answers of at least two tenants.

So the breaker opens when `connection failures + distinct failing tenants >= failure_threshold`
and the streak is not one tenant's failed answers alone; on trial, one failure that is the
backend's own by the same rule reopens it. One tenant's failed answers, however many, never
eject; three tenants whose requests all fail in a row do. Overloaded (429) and refused (4xx)
answers are neither failures nor successes: a busy backend is healthy, and a bad request says
nothing about the backend. Time is the caller's (`now`, in seconds on any monotonic clock), so
every transition is a pure function of its inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from policies.errors import PolicyConfigError

BreakerStatus = Literal["closed", "open", "half_open"]
MIN_FAILING_TENANTS = 2  # failed answers eject only when at least this many tenants got them


@dataclass(slots=True, frozen=True)
class BreakerConfig:
    failure_threshold: int = 3  # failures that are the backend's own, in a row, that eject it
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
    connection_failures: int = 0  # in the streak: since the last completed request (or readmission)
    failing_tenants: frozenset[str] = frozenset()  # tenants whose requests got a failed answer in the streak
    num_ejections: int = 0  # ejections in a row, since the breaker last closed
    open_until: float = 0.0  # when status is "open": the ejection's end
    trial_since: float | None = None  # when status is "half_open": the trial request's start, if one runs
    trial_holder: str | None = None  # ... and who runs it (a request id)

    @property
    def num_failures(self) -> int:
        """The streak's failures as the threshold counts them: each connection failure, each tenant once."""
        return self.connection_failures + len(self.failing_tenants)

    @property
    def is_backend_fault(self) -> bool:
        """Whether the streak holds more than one tenant's failed answers: a connection failure, or
        failed answers of several tenants."""
        return self.connection_failures > 0 or len(self.failing_tenants) >= MIN_FAILING_TENANTS

    def admits(self) -> bool:
        """Whether the backend is a routing candidate now (closed, or half-open on trial)."""
        return self.status != "open"

    def may_probe(self, now: float) -> bool:
        """Whether an ejected backend's ejection has run out, so a probe may decide its fate."""
        return self.status == "open" and now >= self.open_until


def _eject(breaker: Breaker, config: BreakerConfig, now: float) -> Breaker:
    num = breaker.num_ejections + 1
    return Breaker("open", breaker.connection_failures, breaker.failing_tenants, num, now + config.ejection_for(num))


def begin_trial(breaker: Breaker, config: BreakerConfig, now: float, holder: str = "") -> tuple[bool, Breaker]:
    """Whether one more request (`holder`, its id) may be sent to the backend now, and the breaker
    after sending it: always when closed, never when open, one at a time when half-open."""
    if breaker.status == "closed":
        return True, breaker
    if breaker.status == "open":
        return False, breaker
    if breaker.trial_since is not None and now - breaker.trial_since < config.trial_timeout_s:
        return False, breaker
    return True, replace(breaker, trial_since=now, trial_holder=holder)


def end_trial(breaker: Breaker, holder: str) -> Breaker:
    """`holder`'s request got its first byte, or ended saying nothing about the backend: if it was the
    trial, the trial is free again (a no-op for anyone else, and once a success or failure has moved
    the breaker)."""
    if breaker.status != "half_open" or breaker.trial_since is None or breaker.trial_holder != holder:
        return breaker
    return replace(breaker, trial_since=None, trial_holder=None)


def on_success(breaker: Breaker) -> Breaker:
    """A request on the backend completed: closed again, its failures and ejections forgotten."""
    if breaker.status == "open":  # a request that was already under way when it was ejected
        return breaker
    return Breaker()


def on_failure(breaker: Breaker, config: BreakerConfig, now: float, tenant: str | None = None) -> Breaker:
    """A request on the backend failed (before its first byte, or its stream broke). `tenant`: the
    tenant whose request got a failed answer (a 5xx, an error event); None for a connection
    failure (refused, reset, timed out), which is always the backend's own."""
    if breaker.status == "open":
        return breaker  # already out; requests sent before the ejection are still failing
    if tenant is None:
        failed = replace(breaker, connection_failures=breaker.connection_failures + 1)
    else:
        failed = replace(breaker, failing_tenants=breaker.failing_tenants | {tenant})
    if failed.is_backend_fault and (breaker.status == "half_open" or failed.num_failures >= config.failure_threshold):
        return _eject(failed, config, now)
    if breaker.status == "half_open":  # one tenant's failed answer: it says nothing, another request may try
        return replace(failed, trial_since=None, trial_holder=None)
    return failed


def on_probe(breaker: Breaker, config: BreakerConfig, now: float, *, passed: bool) -> Breaker:
    """A health probe answered. It only matters once an ejection has run out: passed lets the
    backend back on trial (half-open, with a fresh streak), failed ejects it again for longer."""
    if not breaker.may_probe(now):
        return breaker
    if passed:
        return replace(breaker, status="half_open", connection_failures=0, failing_tenants=frozenset())
    return _eject(breaker, config, now)
