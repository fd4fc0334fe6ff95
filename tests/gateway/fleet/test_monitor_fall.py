"""gateway/fleet/monitor.py health checks: `health_fall` failed checks in a row mark a backend
down, one passed check brings it back, and a request's `mark_unhealthy` still acts at once."""

from __future__ import annotations

from backends.client import Endpoint
from gateway.fleet.monitor import BackendMonitor, MonitorIntervals
from gateway.metrics import GatewayMetrics
from gateway.store import Store

BACKEND = Endpoint("b1", "http://127.0.0.1:1", "local")


class ScriptedHealth:
    """Stands in for the backend client: each health check answers the next scripted result."""

    def __init__(self, *results: bool) -> None:
        self.results = list(results)

    async def health(self, endpoint: Endpoint) -> bool:
        return self.results.pop(0)


async def test_three_failed_checks_in_a_row_mark_a_backend_down(store: Store) -> None:
    client = ScriptedHealth(False, False, True, False, False, False, True)
    monitor = BackendMonitor([BACKEND], client, store.routing, GatewayMetrics(), MonitorIntervals(health_fall=3))  # type: ignore[arg-type]
    seen = []
    for _ in range(7):
        await monitor.check_health()
        seen.append(monitor.is_healthy("b1"))
    # two slow probes are forgiven (the streak restarts after a pass); the third in a row is not
    assert seen == [True, True, True, True, True, False, True]


async def test_a_request_that_cannot_reach_the_backend_marks_it_down_at_once(store: Store) -> None:
    monitor = BackendMonitor([BACKEND], ScriptedHealth(True), store.routing, GatewayMetrics(), MonitorIntervals())  # type: ignore[arg-type]
    monitor.mark_unhealthy("b1", "connection refused")
    assert not monitor.is_healthy("b1")
    await monitor.check_health()
    assert monitor.is_healthy("b1")
