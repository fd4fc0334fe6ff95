"""A bad network between the gateway and a backend (tests/gateway/fault_proxy.py), through real
processes on loopback: the stub backend (tests/gateway/stub_backend.py: the model adds nothing here)
reached directly as `steady` (a far region: the failover target) and through the fault proxy as
`flaky` (the gateway's own region: always tried first).

Expected: failover before the first byte (refused, reset, half-open peer); an error event after
it (a stream reset or stalled midway), within the read timeout; a 408 when the only backend never
answers; and outlier ejection: three failures in a row eject `flaky` (no more attempts, 429 with
Retry-After), a passed health probe after the ejection puts it on trial, a success readmits it,
and a failure on trial ejects it again for twice as long. Health probes are run by the test
(`check_health`, the health loop's one round) so that each step is deterministic.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cli.processes import ChildProcess
from tests.gateway import stub_backend
from tests.gateway.fault_proxy import HEALTHY, Faults, ProxyThread, running_proxy
from tests.gateway.fixtures_e2e import InProcessGateway, gateway_settings

pytestmark = pytest.mark.slow

BOTH = stub_backend.MODEL_ID  # served by flaky, then steady
FLAKY_ONLY = "@cf/edgerun/bench-stub-flaky"
READ_TIMEOUT_S = 1.5
SLOW = "@cf/edgerun/bench-stub-slow"  # served by `slow`: 40 chunks, 100 ms apart (a trickle)
DEADLINE_S = 2.0
EJECTION_S = 1.0


@pytest.fixture(scope="module")
def stub(stub_backend: ChildProcess) -> ChildProcess:
    return stub_backend


@pytest.fixture(scope="module")
def slow(slow_stub_backend: ChildProcess) -> ChildProcess:
    return slow_stub_backend


@pytest.fixture(scope="module")
def proxy(stub: ChildProcess) -> Iterator[ProxyThread]:
    with running_proxy("127.0.0.1", stub.port) as running:
        yield running


@pytest.fixture(scope="module")
def gw(
    stub: ChildProcess, slow: ChildProcess, proxy: ProxyThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    backends = [
        {"id": "flaky", "base_url": proxy.url, "region": "local", "models": [BOTH, FLAKY_ONLY]},
        {"id": "steady", "base_url": stub.url, "region": "far", "models": [BOTH]},
        {"id": "slow", "base_url": slow.url, "region": "local", "models": [SLOW]},
    ]
    models = [{"id": m, "backend_model": "stub", "block_size": 16} for m in (BOTH, FLAKY_ONLY, SLOW)]
    settings = gateway_settings(
        tmp_path_factory.mktemp("faults"), backends, models=models, region="local", region_fallbacks=["far"],
        health_interval_s=3600.0,  # the test probes (`probe`)
        breaker_failure_threshold=3, breaker_ejection_s=EJECTION_S, breaker_max_ejection_s=10 * EJECTION_S,
        backend_first_byte_timeout_s=READ_TIMEOUT_S, backend_read_timeout_s=READ_TIMEOUT_S,
        request_deadline_s=DEADLINE_S,
    )
    started = InProcessGateway(settings).start()
    started.secret = started.new_key("t-faults", "acc-faults")  # type: ignore[attr-defined]
    yield started
    started.stop()


def post(gw: InProcessGateway, model: str, **body: Any) -> httpx.Response:
    url = f"{gw.url}/client/v4/accounts/acc-faults/ai/run/{model}"
    headers = {"authorization": f"Bearer {gw.secret}"}  # type: ignore[attr-defined]
    return httpx.post(url, json={"prompt": "hello", "max_tokens": 64, **body}, headers=headers, timeout=30)


def probe(gw: InProcessGateway) -> None:
    gw.call(gw.services.monitor.check_health())


def breaker(gw: InProcessGateway, backend: str = "flaky") -> tuple[float | None, float | None]:
    """(state: 0 closed, 1 half-open, 2 open; ejections so far) from the gateway's metrics."""
    registry = gw.services.metrics.registry
    labels = {"backend": backend}
    return (
        registry.get_sample_value("edgerun_gateway_backend_breaker_state", labels),
        registry.get_sample_value("edgerun_gateway_backend_ejections_total", labels) or 0.0,
    )


def heal(gw: InProcessGateway, proxy: ProxyThread) -> None:
    """Back to a healthy network, flaky healthy and its failures forgotten (one request completed)."""
    proxy.set(HEALTHY)
    proxy.accept()
    probe(gw)
    assert post(gw, FLAKY_ONLY).status_code == 200
    assert breaker(gw)[0] == 0


def sse_events(response: httpx.Response) -> list[Any]:
    return [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
            for line in response.text.splitlines() if line.startswith("data: ")]


@pytest.mark.parametrize("fault", ["refused", "reset", "half_open"])
def test_a_backend_failing_before_its_first_byte_is_failed_over(
    gw: InProcessGateway, proxy: ProxyThread, fault: str
) -> None:
    heal(gw, proxy)
    if fault == "refused":
        proxy.refuse()
        proxy.reset_all()  # kept-alive connections too
    else:
        proxy.set(Faults(reset=fault == "reset", black_hole=fault == "half_open"))
        proxy.reset_all()
    answer = post(gw, BOTH)
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["usage"]["completion_tokens"] == 64
    record = gw.ledger_record(answer.headers["cf-ray"])
    assert record.backend_id == "steady" and record.status == "ok"
    assert breaker(gw)[0] == 0  # one failure: not ejected
    heal(gw, proxy)


@pytest.mark.parametrize("fault", [Faults(reset_after_bytes=700), Faults(stall_after_bytes=700)], ids=["reset", "stall"])
def test_a_stream_broken_midway_ends_with_an_error_event_and_is_billed_for_what_came(
    gw: InProcessGateway, proxy: ProxyThread, fault: Faults
) -> None:
    heal(gw, proxy)
    proxy.set(fault)
    proxy.reset_all()  # a fresh connection: the byte count starts at this request
    started = time.monotonic()
    answer = post(gw, FLAKY_ONLY, stream=True)
    elapsed = time.monotonic() - started
    events = sse_events(answer)
    assert answer.status_code == 200
    assert events[-1] != "[DONE]" and events[-1]["errors"][0]["code"] == 3043, events[-3:]
    texts = [e for e in events[:-1] if e.get("response")]
    assert 1 <= len(texts) < 64
    assert elapsed < READ_TIMEOUT_S + 5  # not stuck past the read timeout (generous: a loaded machine)
    record = gw.ledger_record(answer.headers["cf-ray"])
    # billed for what came (the stub sends no token ids: its text is re-tokenized, " tok" is 2 tokens)
    assert record.status == "backend_error" and record.completion_tokens == 2 * len(texts)
    heal(gw, proxy)


def test_a_backend_that_never_answers_is_a_408_after_the_first_byte_timeout(
    gw: InProcessGateway, proxy: ProxyThread
) -> None:
    heal(gw, proxy)
    proxy.set(Faults(black_hole=True))
    proxy.reset_all()
    answer = post(gw, FLAKY_ONLY)
    assert answer.status_code == 408 and answer.json()["errors"][0]["code"] == 3007, answer.text
    record = gw.ledger_record(answer.headers["cf-ray"])  # it reached a backend: recorded, free
    assert record.status == "backend_error" and record.cost_micro == 0 and record.completion_tokens == 0
    heal(gw, proxy)


def test_repeated_failures_eject_a_backend_until_a_probe_and_a_success_readmit_it(
    gw: InProcessGateway, proxy: ProxyThread
) -> None:
    heal(gw, proxy)
    _, ejections = breaker(gw)
    proxy.set(Faults(reset=True))
    proxy.reset_all()
    for _ in range(3):
        failed = post(gw, FLAKY_ONLY)
        assert failed.status_code == 429 and failed.headers["retry-after"] == "1", failed.text
    assert breaker(gw) == (2, ejections + 1)
    tried = proxy.proxy.stats.connections
    refused = post(gw, FLAKY_ONLY)  # ejected: answered at once, flaky not even tried
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1, refused.text
    assert proxy.proxy.stats.connections == tried
    assert post(gw, BOTH).status_code == 200  # the other backend carries the traffic
    # Flapping: the network is back, the ejection runs out, the probe passes; on trial, it fails again.
    proxy.set(HEALTHY)
    time.sleep(EJECTION_S)
    probe(gw)
    assert breaker(gw)[0] == 1
    proxy.set(Faults(reset=True))
    assert post(gw, FLAKY_ONLY).status_code == 429
    assert breaker(gw) == (2, ejections + 2)
    assert int(post(gw, FLAKY_ONLY).headers["retry-after"]) == 2 * EJECTION_S  # the second ejection is twice as long
    # Healthy for good: after the (longer) ejection a probe and one completed request close it.
    proxy.set(HEALTHY)
    probe(gw)  # too early: still ejected
    assert breaker(gw)[0] == 2
    time.sleep(2 * EJECTION_S)
    probe(gw)
    answer = post(gw, FLAKY_ONLY)
    assert answer.status_code == 200, answer.text
    assert breaker(gw) == (0, ejections + 2)
    assert gw.ledger_record(answer.headers["cf-ray"]).backend_id == "flaky"


def test_a_trial_whose_client_hangs_up_after_its_first_tokens_readmits_the_backend(
    gw: InProcessGateway, proxy: ProxyThread
) -> None:
    """The one trial request after an ejection reported neither success nor failure when its client
    left, so every other request got 429 until the trial timed out. A stream that produced tokens is a success."""
    heal(gw, proxy)
    _, ejections = breaker(gw)
    proxy.set(Faults(reset=True))
    proxy.reset_all()
    for _ in range(3):
        assert post(gw, FLAKY_ONLY).status_code == 429
    assert breaker(gw) == (2, ejections + 1)
    proxy.set(HEALTHY)
    time.sleep(EJECTION_S)
    probe(gw)
    assert breaker(gw)[0] == 1  # on trial
    proxy.set(Faults(stall_after_bytes=700))  # a few tokens, then the backend stalls: the client gives up
    proxy.reset_all()
    url = f"{gw.url}/client/v4/accounts/acc-faults/ai/run/{FLAKY_ONLY}"
    headers = {"authorization": f"Bearer {gw.secret}"}  # type: ignore[attr-defined]
    with httpx.stream("POST", url, json={"prompt": "hello", "max_tokens": 64, "stream": True}, headers=headers,
                      timeout=30) as response:
        assert response.status_code == 200
        assert next(line for line in response.iter_lines() if line.startswith("data: "))  # a token came
    deadline = time.monotonic() + 5 * READ_TIMEOUT_S
    while breaker(gw)[0] != 0:
        assert time.monotonic() < deadline, f"the cancelled trial never reported: breaker {breaker(gw)}"
        time.sleep(0.05)
    assert breaker(gw) == (0, ejections + 1)
    heal(gw, proxy)


def test_added_latency_slows_a_stream_but_it_completes(gw: InProcessGateway, proxy: ProxyThread) -> None:
    heal(gw, proxy)
    proxy.set(Faults(latency_s=0.05))
    answer = post(gw, FLAKY_ONLY, stream=True)
    events = sse_events(answer)
    assert events[-1] == "[DONE]" and events[-2]["usage"]["completion_tokens"] == 64
    heal(gw, proxy)


def test_a_backend_that_trickles_is_cut_at_the_request_deadline(gw: InProcessGateway) -> None:
    started = time.monotonic()
    answer = post(gw, SLOW, stream=True)
    elapsed = time.monotonic() - started
    events = sse_events(answer)
    assert events[-1] != "[DONE]" and events[-1]["errors"][0]["code"] == 3007, events[-2:]
    texts = [e for e in events[:-1] if e.get("response")]
    assert 1 <= len(texts) < 40 and elapsed < DEADLINE_S + 3
    record = gw.ledger_record(answer.headers["cf-ray"])
    assert record.status == "cancelled" and record.completion_tokens > 0  # billed for what it got
    whole = post(gw, SLOW)
    assert whole.status_code == 408 and whole.json()["errors"][0]["code"] == 3007, whole.text
