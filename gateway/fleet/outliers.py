"""Outlier ejection: one circuit breaker (`policies.breaker`) per backend, fed by what requests and
health probes see, with its state on /metrics.

Requests report their outcome: `record_error` for a backend error, with the tenant whose request
met it, and `record_success` for a completed stream. A connection failure (refused, reset, timed
out, before the first byte or midway) counts against the backend whoever sent the request; a
failed answer (a 5xx, an error event, a malformed stream: the backend read the request, whose
content may be the cause) counts once per tenant and never alone, so one tenant's requests cannot
eject a backend (the rule in policies/breaker.py). A 429 or another 4xx is ignored: a busy
backend is healthy, a bad request is the client's. A request that ends saying nothing about its
backend, or whose backend has answered its first byte, gives back the trial it may hold (`end_trials`). The health loop reports each probe
(`record_probe`): after an ejection has run out, a passed probe lets the backend back on trial, a
failed one ejects it again for twice as long. `admits` is what routing asks (through
`BackendMonitor.is_healthy`). `retry_after_s` says when the first ejected backend may be back,
for a 429's Retry-After when every backend is out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import structlog

from backends.client import BackendError, BackendStreamBroken, BackendTimeout, BackendUnavailable
from gateway.metrics import GatewayMetrics
from policies.breaker import Breaker, BreakerConfig, begin_trial, end_trial, on_failure, on_probe, on_success

log = structlog.get_logger("edgerun.gateway.fleet.outliers")

STATE_VALUES = {"closed": 0, "half_open": 1, "open": 2}  # the gauge's values


def counts_against_backend(exc: BackendError) -> bool:
    """Whether an error says the backend is unwell (not busy, not the request's own fault). A connect
    timeout whose timer fired late is this gateway's busy event loop, not the backend's fault."""
    if isinstance(exc, BackendTimeout) and exc.late:
        return False
    return isinstance(exc, BackendUnavailable | BackendTimeout | BackendStreamBroken)


def is_connection_failure(exc: BackendError) -> bool:
    """Whether the backend could not be reached or talked to (refused, reset, timed out): its own
    failure, whoever sent the request. A 429 is not one (a busy backend is healthy), nor a 4xx."""
    return counts_against_backend(exc) and not exc.answered


class OutlierDetector:
    def __init__(
        self,
        backend_ids: Iterable[str],
        config: BreakerConfig,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.breakers = {backend_id: Breaker() for backend_id in backend_ids}
        for backend_id in self.breakers:
            self._publish(backend_id, Breaker())
            metrics.backend_ejections.labels(backend_id)  # at 0 from the start: rate() sees the first one

    def admits(self, backend_id: str) -> bool:
        breaker = self.breakers.get(backend_id)
        return breaker is None or breaker.admits()

    def may_try(self, backend_id: str, holder: str = "") -> bool:
        """Whether request `holder` may be sent to the backend now: a backend on trial takes one at a time."""
        breaker = self.breakers.get(backend_id)
        if breaker is None:
            return True
        allowed, self.breakers[backend_id] = begin_trial(breaker, self.config, self.clock(), holder)
        return allowed

    def record_error(self, exc: BackendError, tenant: str, holder: str = "") -> None:
        """`tenant`'s request (`holder`) met `exc`; a failed answer counts as that tenant's, a
        connection failure as anyone's; an error that counts neither way (429, 4xx) ends its trial."""
        if exc.endpoint_id is None:
            return
        if counts_against_backend(exc):
            who = tenant if exc.answered else None
            self._move(exc.endpoint_id, lambda b: on_failure(b, self.config, self.clock(), who), exc.message)
        elif (breaker := self.breakers.get(exc.endpoint_id)) is not None:
            self.breakers[exc.endpoint_id] = end_trial(breaker, holder)

    def end_trials(self, holder: str) -> None:
        """A trial request `holder` still holds is free for another request: its backend answered its
        first byte, or it ended saying nothing about the backend (cancelled before any token, refused,
        overloaded)."""
        for backend_id, breaker in self.breakers.items():
            if breaker.trial_holder == holder:
                self.breakers[backend_id] = end_trial(breaker, holder)

    def record_success(self, backend_id: str) -> None:
        self._move(backend_id, on_success, "a request completed")

    def record_probe(self, backend_id: str, *, passed: bool) -> None:
        reason = "the health probe passed" if passed else "the health probe failed"
        self._move(backend_id, lambda b: on_probe(b, self.config, self.clock(), passed=passed), reason)

    def retry_after_s(self, backend_ids: Iterable[str]) -> float | None:
        """Seconds until the first of these ejected backends may be probed (None: one is not ejected)."""
        now, waits = self.clock(), []
        for backend_id in backend_ids:
            breaker = self.breakers.get(backend_id)
            if breaker is None or breaker.admits():
                return None
            waits.append(max(0.0, breaker.open_until - now))
        return math.ceil(min(waits)) if waits else None

    def _move(self, backend_id: str, transition: Callable[[Breaker], Breaker], reason: str) -> None:
        before = self.breakers.get(backend_id)
        if before is None:
            return
        after = transition(before)
        if after == before:
            return
        self.breakers[backend_id] = after
        if after.status != before.status:
            self._publish(backend_id, after)
            if after.status == "open":
                self.metrics.backend_ejections.labels(backend_id).inc()
                ejection = round(after.open_until - self.clock(), 3)
                log.warning("backend ejected", backend=backend_id, reason=reason, ejection_s=ejection,
                            num_ejections=after.num_ejections)
            else:
                log.info("backend breaker changed", backend=backend_id, state=after.status, reason=reason)

    def _publish(self, backend_id: str, breaker: Breaker) -> None:
        self.metrics.backend_breaker_state.labels(backend_id).set(STATE_VALUES[breaker.status])
