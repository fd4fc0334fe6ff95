from __future__ import annotations

from backends.client import BackendOverloaded, BackendRejected, BackendStreamBroken, BackendTimeout, BackendUnavailable
from gateway.fleet.outliers import OutlierDetector
from gateway.metrics import GatewayMetrics
from policies.breaker import BreakerConfig
from tests.clock import Clock


def detector() -> tuple[OutlierDetector, Clock, GatewayMetrics]:
    clock, metrics = Clock(), GatewayMetrics()
    return OutlierDetector(["b1", "b2"], BreakerConfig(2, 5.0, 60.0), metrics, clock), clock, metrics


def sample(metrics: GatewayMetrics, name: str, backend: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"backend": backend})


def test_refusals_timeouts_and_broken_streams_eject_and_busy_or_bad_requests_do_not() -> None:
    outliers, _, metrics = detector()
    for harmless in (BackendOverloaded("429", endpoint_id="b1"), BackendRejected("400", status=400, endpoint_id="b1")):
        outliers.record_error(harmless, "t1")
        outliers.record_error(harmless, "t1")
    assert outliers.admits("b1")
    outliers.record_error(BackendTimeout("slow", endpoint_id="b1"), "t1")
    outliers.record_error(BackendStreamBroken("reset", endpoint_id="b1"), "t1")
    assert not outliers.admits("b1") and outliers.admits("b2")
    assert sample(metrics, "edgerun_gateway_backend_breaker_state", "b1") == 2
    assert sample(metrics, "edgerun_gateway_backend_ejections_total", "b1") == 1
    assert sample(metrics, "edgerun_gateway_backend_breaker_state", "b2") == 0


def test_an_ejected_backend_comes_back_on_trial_after_a_probe_then_fully_after_a_success() -> None:
    outliers, clock, metrics = detector()
    for _ in range(2):
        outliers.record_error(BackendUnavailable("refused", endpoint_id="b1"), "t1")
    outliers.record_probe("b1", passed=True)  # too early: still ejected
    assert not outliers.admits("b1")
    assert outliers.retry_after_s(["b1", "b2"]) is None  # b2 can take the request
    assert outliers.retry_after_s(["b1"]) == 5
    clock.now += 5
    outliers.record_probe("b1", passed=True)
    assert outliers.admits("b1") and sample(metrics, "edgerun_gateway_backend_breaker_state", "b1") == 1
    outliers.record_success("b1")
    assert sample(metrics, "edgerun_gateway_backend_breaker_state", "b1") == 0


def test_errors_without_a_backend_or_for_an_unknown_one_change_nothing() -> None:
    outliers, _, _ = detector()
    for _ in range(3):
        outliers.record_error(BackendUnavailable("no endpoints"), "t1")
        outliers.record_error(BackendUnavailable("refused", endpoint_id="elsewhere"), "t1")
    assert outliers.admits("b1") and outliers.admits("b2") and outliers.admits("elsewhere")


def test_a_backend_on_trial_is_tried_by_one_request_at_a_time() -> None:
    outliers, clock, _ = detector()
    for _ in range(2):
        outliers.record_error(BackendUnavailable("refused", endpoint_id="b1"), "t1")
    clock.now += 5
    outliers.record_probe("b1", passed=True)
    assert outliers.may_try("b1", "r1") and not outliers.may_try("b1", "r2")  # the second goes to another backend
    assert outliers.may_try("b2") and outliers.may_try("b2")  # closed: no limit
    outliers.end_trials("r2")  # not the trial's holder: nothing changes
    assert not outliers.may_try("b1", "r3")
    outliers.end_trials("r1")  # the trial ended without a verdict (its client left): another may try
    assert outliers.may_try("b1", "r3") and not outliers.may_try("b1", "r4")
    outliers.record_error(BackendOverloaded("b1 answered 429", endpoint_id="b1"), "t1", "r4")  # not the trial
    assert not outliers.may_try("b1", "r5")
    outliers.record_error(BackendOverloaded("b1 answered 429", endpoint_id="b1"), "t1", "r3")  # busy: no verdict
    assert outliers.may_try("b1", "r5")
    outliers.record_error(BackendRejected("b1 answered 400", status=400, endpoint_id="b1"), "t1", "r5")
    assert outliers.may_try("b1", "r6") and outliers.breakers["b1"].status == "half_open"
    outliers.record_success("b1")
    assert outliers.may_try("b1") and outliers.may_try("b1")


def test_connect_timeouts_that_only_this_gateways_busy_loop_caused_do_not_eject() -> None:
    outliers, _, _ = detector()
    for _ in range(5):
        outliers.record_error(BackendTimeout("connect timed out, the event loop busy", endpoint_id="b1", late=True), "t1")
    assert outliers.admits("b1")


def test_failed_answers_to_one_tenant_never_eject_but_those_of_two_tenants_do() -> None:
    outliers, _, metrics = detector()  # threshold 2
    for _ in range(10):
        outliers.record_error(BackendUnavailable("b1 answered 500: bad schema", endpoint_id="b1", answered=True), "bomber")
        outliers.record_error(BackendStreamBroken("b1 stream failed: boom", endpoint_id="b1", answered=True), "bomber")
    assert outliers.admits("b1") and sample(metrics, "edgerun_gateway_backend_ejections_total", "b1") == 0
    outliers.record_error(BackendUnavailable("b1 answered 500", endpoint_id="b1", answered=True), "someone else")
    assert not outliers.admits("b1")
    outliers.record_error(BackendUnavailable("b2 unreachable: refused", endpoint_id="b2"), "bomber")
    outliers.record_error(BackendUnavailable("b2 unreachable: refused", endpoint_id="b2"), "bomber")
    assert not outliers.admits("b2")  # connection failures count whoever sent the request
