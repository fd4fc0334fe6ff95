"""The batch worker (gateway/http/batch_worker.py) in a gateway in front of the stub backend, with each
store: idle, it waits for work instead of claiming on a timer (one look per `batch_idle_poll_s`, not
one per `batch_poll_interval_s`), and a batch queued then starts at once, not at the next look."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from cli.processes import ChildProcess
from gateway.store import Store
from tests.gateway import stub_backend as stub
from tests.gateway.fixtures_e2e import InProcessGateway, gateway_settings
from tests.gateway.redis_server import delete_prefix, new_prefix
from tests.gateway.store.counting import CountedConcern, Counts

IDLE_POLL_S = 30.0  # longer than either test: whatever they see came from a wake-up


@pytest.fixture(params=["sqlite", pytest.param("redis", marks=pytest.mark.process)])
def counted_gateway(request: pytest.FixtureRequest, stub_backend: ChildProcess, tmp_path: Path
                    ) -> Iterator[tuple[InProcessGateway, Counts]]:
    """A gateway whose batch queue calls are counted (queue.claim, queue.wait_for_work, ...)."""
    store: dict[str, object] = {}
    if request.param == "redis":
        store = {"redis_url": request.getfixturevalue("redis_url"), "key_prefix": new_prefix()}
    backends = [{"id": "stub", "base_url": stub_backend.url, "region": "local", "models": [stub.MODEL_ID]}]
    settings = gateway_settings(tmp_path, backends, models=[{"id": stub.MODEL_ID, "backend_model": "stub"}],
                                batch_idle_poll_s=IDLE_POLL_S, batch_poll_interval_s=0.05, **store)
    counts = Counts()

    def counted_queue(inner: Store) -> Store:
        return replace(inner, queue=CountedConcern(inner.queue, "queue", counts))

    gateway = InProcessGateway(settings, wrap_store=counted_queue).start()
    try:
        yield gateway, counts
    finally:
        gateway.stop()
        if request.param == "redis":
            delete_prefix(str(store["redis_url"]), str(store["key_prefix"]))


def test_an_idle_worker_makes_no_store_calls_between_its_looks(counted_gateway: tuple[InProcessGateway, Counts]) -> None:
    gateway, counts = counted_gateway
    time.sleep(0.5)  # its first look (a claim: nothing) is over; it waits
    counts.reset()
    time.sleep(2.0)  # 40 claims at batch_poll_interval_s, had it polled
    assert counts.calls.count("queue.claim") == 0, counts.calls


def test_a_queued_item_starts_at_once(counted_gateway: tuple[InProcessGateway, Counts]) -> None:
    gateway, counts = counted_gateway
    key = gateway.new_key("t-wake", "acc-wake")
    url = f"{gateway.url}/client/v4/accounts/acc-wake/ai/run/{stub.MODEL_ID}"
    headers = {"authorization": f"Bearer {key}"}
    time.sleep(0.5)  # idle: waiting for work
    counts.reset()
    queued_at = time.monotonic()
    answer = httpx.post(url + "?queueRequest=true", json={"requests": [{"prompt": "hi", "max_tokens": 4}]},
                        headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    batch_id = answer.json()["result"]["request_id"]
    while "responses" not in (result := _state(url, headers, batch_id)):
        assert time.monotonic() - queued_at < 5.0, f"still {result['status']} after 5 s (the idle poll: {IDLE_POLL_S} s)"
        time.sleep(0.05)
    assert counts.calls.count("queue.claim") >= 1


def _state(url: str, headers: dict[str, str], batch_id: str) -> dict[str, object]:
    answer = httpx.post(url + "?queueRequest=true", json={"request_id": batch_id}, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    result: dict[str, object] = answer.json()["result"]
    return result
