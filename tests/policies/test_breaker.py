from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.breaker import Breaker, BreakerConfig, begin_trial, end_trial, on_failure, on_probe, on_success
from policies.errors import PolicyConfigError

CONFIG = BreakerConfig(failure_threshold=3, ejection_s=5.0, max_ejection_s=20.0)
CLOSED = Breaker()


def failed(times: int, breaker: Breaker = CLOSED, now: float = 0.0, tenant: str | None = None) -> Breaker:
    """`times` failures: connection failures, or failed answers to `tenant`'s requests."""
    for _ in range(times):
        breaker = on_failure(breaker, CONFIG, now, tenant)
    return breaker


def test_a_backend_is_ejected_at_the_threshold_of_consecutive_failures_only() -> None:
    assert failed(2).admits() and failed(2).num_failures == 2
    ejected = failed(3, now=100.0)
    assert ejected.status == "open" and not ejected.admits()
    assert ejected.open_until == 105.0 and ejected.num_ejections == 1


def test_a_success_forgets_earlier_failures() -> None:
    assert on_success(failed(2)) == Breaker()
    assert failed(2, on_success(failed(2))).admits()  # 2 + 2 failures, not 4 in a row


def test_the_ejection_holds_until_its_end_whatever_the_probe_says() -> None:
    ejected = failed(3, now=0.0)
    assert on_probe(ejected, CONFIG, 4.9, passed=True) == ejected
    assert not ejected.may_probe(4.9) and ejected.may_probe(5.0)


def test_a_passed_probe_lets_the_backend_back_on_trial_and_a_success_closes_it() -> None:
    trial = on_probe(failed(3), CONFIG, 5.0, passed=True)
    assert trial.status == "half_open" and trial.admits()
    assert on_success(trial) == Breaker()


def test_one_failure_on_trial_ejects_again_for_twice_as_long() -> None:
    trial = on_probe(failed(3), CONFIG, 5.0, passed=True)
    again = on_failure(trial, CONFIG, 10.0)
    assert again.status == "open" and again.num_ejections == 2 and again.open_until == 20.0


def test_failed_probes_back_off_up_to_the_cap() -> None:
    breaker, now, lengths = failed(3), 0.0, []
    for _ in range(5):
        now = breaker.open_until
        next_breaker = on_probe(breaker, CONFIG, now, passed=False)
        lengths.append(next_breaker.open_until - now)
        breaker = next_breaker
    assert lengths == [10.0, 20.0, 20.0, 20.0, 20.0]


def test_failures_and_successes_of_requests_sent_before_the_ejection_change_nothing() -> None:
    ejected = failed(3)
    assert on_failure(ejected, CONFIG, 1.0) == ejected
    assert on_success(ejected) == ejected


@pytest.mark.parametrize("values", [{"failure_threshold": 0}, {"ejection_s": 0}, {"ejection_s": 10, "max_ejection_s": 5}])
def test_bad_configuration_is_refused(values: dict[str, float]) -> None:
    with pytest.raises(PolicyConfigError):
        BreakerConfig(**values)  # type: ignore[arg-type]


events = st.lists(st.tuples(st.sampled_from(["ok", "fail", "probe_ok", "probe_fail"]), st.floats(0, 10)), max_size=60)


@given(events)
def test_any_history_keeps_the_invariants(history: list[tuple[str, float]]) -> None:
    breaker, now = Breaker(), 0.0
    for event, step in history:
        now += step
        before = breaker
        if event == "ok":
            breaker = on_success(breaker)
        elif event == "fail":
            breaker = on_failure(breaker, CONFIG, now)
        else:
            breaker = on_probe(breaker, CONFIG, now, passed=event == "probe_ok")
        assert not (breaker.is_backend_fault and breaker.num_failures >= CONFIG.failure_threshold) or breaker.status == "open"
        if breaker.status == "open":
            assert now < breaker.open_until <= now + CONFIG.max_ejection_s or breaker == before
        if before.status == "open" and breaker.status != "open":  # only a probe after the ejection readmits
            assert event == "probe_ok" and now >= before.open_until


def test_a_backend_on_trial_takes_one_request_at_a_time() -> None:
    config = BreakerConfig(failure_threshold=3, ejection_s=5.0, max_ejection_s=20.0, trial_timeout_s=10.0)
    assert begin_trial(CLOSED, config, 0.0) == (True, CLOSED)  # closed: no bookkeeping at all
    assert begin_trial(failed(3), config, 1.0)[0] is False  # ejected
    trial = on_probe(failed(3), config, 5.0, passed=True)
    allowed, running = begin_trial(trial, config, 6.0)
    assert allowed and running.trial_since == 6.0
    assert begin_trial(running, config, 7.0) == (False, running)  # the second one goes elsewhere
    assert begin_trial(running, config, 16.0)[0]  # the first never reported back: the trial is free again
    assert on_success(running) == CLOSED and begin_trial(on_success(running), config, 7.0)[0]
    assert on_failure(running, config, 7.0).status == "open"


def test_one_tenants_failed_answers_never_eject_however_many() -> None:
    """A failed answer (a 5xx) may be the request's own doing: one tenant's, alone, never ejects."""
    bombed = failed(1000, tenant="attacker")
    assert bombed.status == "closed" and bombed.num_failures == 1 and not bombed.is_backend_fault
    trial = on_probe(failed(3), CONFIG, 5.0, passed=True)
    _, running = begin_trial(trial, CONFIG, 6.0, "bomb")
    after = on_failure(running, CONFIG, 7.0, "attacker")
    assert after.status == "half_open" and begin_trial(after, CONFIG, 7.0)[0]  # the trial is free for another request


def test_failed_answers_count_once_per_tenant_and_eject_across_tenants() -> None:
    two = on_failure(failed(5, tenant="a"), CONFIG, 0.0, "b")
    assert two.status == "closed" and two.num_failures == 2 and two.is_backend_fault
    assert on_failure(two, CONFIG, 0.0, "c").status == "open"  # three tenants in a row: the backend's own
    assert on_failure(two, CONFIG, 0.0, "a").status == "closed"  # a tenant counts once
    assert on_failure(two, CONFIG, 0.0).status == "open"  # and a connection failure adds up with them
    trial = on_probe(failed(3), CONFIG, 5.0, passed=True)
    assert on_failure(on_failure(trial, CONFIG, 6.0, "a"), CONFIG, 6.0, "b").status == "open"  # on trial: two tenants


def test_connection_failures_eject_even_with_one_tenant_sending() -> None:
    """A backend that is down (refused, reset, timed out) is ejected whoever sends: tenant None."""
    assert failed(3).status == "open"
    assert failed(2, failed(5, tenant="only")).status == "open"  # one tenant's answers (once) + 2 connection failures
    assert failed(1, failed(5, tenant="only")).status == "closed"


def test_a_trial_is_given_back_only_by_its_holder() -> None:
    config = BreakerConfig(failure_threshold=3, ejection_s=5.0, max_ejection_s=20.0, trial_timeout_s=30.0)
    trial = on_probe(failed(3), config, 5.0, passed=True)
    _, running = begin_trial(trial, config, 6.0, "r1")
    assert end_trial(running, "r2") == running and not begin_trial(running, config, 7.0, "r2")[0]
    freed = end_trial(running, "r1")
    assert freed.status == "half_open" and freed.trial_since is None
    assert begin_trial(freed, config, 7.0, "r2")[0]  # long before the 30 s trial timeout
    assert end_trial(on_success(running), "r1") == CLOSED and end_trial(CLOSED, "r1") == CLOSED


single_tenant_events = st.lists(
    st.tuples(st.sampled_from(["ok", "fail", "probe_ok", "probe_fail"]), st.floats(0, 10)), max_size=60
)


@given(single_tenant_events)
def test_no_history_of_one_tenants_failed_answers_ejects_a_closed_backend(history: list[tuple[str, float]]) -> None:
    breaker, now = Breaker(), 0.0
    for event, step in history:
        now += step
        if event == "ok":
            breaker = on_success(breaker)
        elif event == "fail":
            breaker = on_failure(breaker, CONFIG, now, "attacker")
        else:  # probes only act on an open breaker
            breaker = on_probe(breaker, CONFIG, now, passed=event == "probe_ok")
        assert breaker.status == "closed"
