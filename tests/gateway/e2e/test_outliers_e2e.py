"""Outlier ejection through a real gateway: a trial holds its backend only until the first byte.

After an ejection the backend takes one request at a time, and a long stream on trial used to
refuse every other request (429) until it ended or `backend_first_byte_timeout_s` (30 s) passed,
though its backend was plainly answering.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from cli.processes import ChildProcess
from policies.breaker import Breaker
from tests.gateway.fixtures_e2e import InProcessGateway, gateway_settings

pytestmark = pytest.mark.slow

SLOW = "@cf/edgerun/bench-stub-slow"  # `slow`: 40 chunks 100 ms apart


@pytest.fixture(scope="module")
def gw(slow_stub_backend: ChildProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    backends = [{"id": "slow", "base_url": slow_stub_backend.url, "region": "local", "models": [SLOW]}]
    settings = gateway_settings(
        tmp_path_factory.mktemp("outliers"), backends, models=[{"id": SLOW, "backend_model": "stub", "block_size": 16}],
        health_interval_s=3600.0,  # nothing but requests changes the backend's state here
    )
    started = InProcessGateway(settings).start()
    started.secret = started.new_key("t-outliers", "acc-outliers")  # type: ignore[attr-defined]
    yield started
    started.stop()


def status(gw: InProcessGateway, backend: str) -> str:
    return gw.services.monitor.outliers.breakers[backend].status


def test_a_trial_stream_frees_the_trial_at_its_first_byte(gw: InProcessGateway) -> None:
    outliers = gw.services.monitor.outliers

    async def on_trial() -> None:  # as after an ejection and a passed probe
        outliers.breakers["slow"] = Breaker(status="half_open", num_ejections=1)

    gw.call(on_trial())
    url = f"{gw.url}/client/v4/accounts/acc-outliers/ai/run/{SLOW}"
    headers = {"authorization": f"Bearer {gw.secret}"}  # type: ignore[attr-defined]
    body = {"prompt": "hello", "max_tokens": 64, "stream": True}
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as trial:
        assert trial.status_code == 200
        lines = trial.iter_lines()  # held open: closing the iterator would hang up (a cancelled trial)
        assert next(line for line in lines if line.startswith("data: "))  # the trial's first token
        assert status(gw, "slow") == "half_open"  # the trial streams on
        second = httpx.post(url, json={"prompt": "hi", "max_tokens": 2}, headers=headers, timeout=30)
        assert second.status_code == 200, second.text  # was 429 until the trial's 4-second stream ended
        assert status(gw, "slow") == "closed"  # a completed request readmitted it
        assert [line for line in lines if line.startswith("data: ")][-1] == "data: [DONE]"  # the trial, whole
