"""A burst of ten times more requests than the gateway may send to its backend (the slow stub:
4-second streams): the ones that fit are served to the end, every other one is answered 429 /
3040 with Retry-After at once, without waiting for a slot; nothing times out, nothing is lost,
and the refused requests leave no ledger record. (A tenant at its concurrency limit and the cap on
connections with the real model: tests/gateway/e2e/test_overload.py.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.processes import ChildProcess
from tests.gateway.fixtures_e2e import InProcessGateway, gateway_settings
from tests.gateway.stub_backend import MODEL_ID as STUB_MODEL

pytestmark = pytest.mark.slow

CAP = 4  # backend_max_connections
BURST = 40


@pytest.fixture
def capped(slow_stub_backend: ChildProcess, tmp_path: Path) -> Iterator[InProcessGateway]:
    backends = [{"id": "slow", "base_url": slow_stub_backend.url, "region": "local", "models": [STUB_MODEL]}]
    settings = gateway_settings(tmp_path, backends, models=[{"id": STUB_MODEL, "backend_model": "stub", "block_size": 16}],
                                backend_max_connections=CAP)
    started = InProcessGateway(settings).start()
    yield started
    started.stop()


def test_a_burst_past_capacity_is_refused_at_once_and_what_fits_is_served(capped: InProcessGateway) -> None:
    secret = capped.new_key("t-burst", "acc-burst")

    async def burst() -> list[tuple[int, float, str, str | None]]:
        limits = httpx.Limits(max_connections=BURST)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:

            async def one() -> tuple[int, float, str, str | None]:
                started = time.monotonic()
                response = await http.post(
                    f"{capped.url}/client/v4/accounts/acc-burst/ai/run/{STUB_MODEL}",
                    json={"prompt": "hello", "max_tokens": 64}, headers={"authorization": f"Bearer {secret}"},
                )
                retry_after = response.headers.get("retry-after")
                return response.status_code, time.monotonic() - started, response.headers["cf-ray"], retry_after

            return list(await asyncio.gather(*(one() for _ in range(BURST))))

    answers = asyncio.run(burst())
    served = [a for a in answers if a[0] == 200]
    refused = [a for a in answers if a[0] == 429]
    assert len(served) + len(refused) == BURST, sorted({a[0] for a in answers})  # no 408, no 5xx
    assert 1 <= len(served) and len(refused) >= BURST - 2 * CAP
    assert all(retry_after is not None and int(retry_after) >= 1 for *_, retry_after in refused)
    refusal_s = sorted(seconds for _, seconds, _, _ in refused)
    stream_s = min(seconds for _, seconds, _, _ in served)
    assert refusal_s[len(refusal_s) // 2] < stream_s / 2  # refused at once, not after a wait for a slot
    for _, _, request_id, _ in served:
        assert capped.ledger_record(request_id).status == "ok"
    assert capped.store is not None
    assert all(capped.call(capped.store.ledger.get(request_id)) is None for _, _, request_id, _ in refused)
    print(f"burst: {BURST} requests at once, cap {CAP}: {len(served)} served in >= {stream_s:.2f} s, "
          f"{len(refused)} refused 429 with Retry-After, p50/max refusal {refusal_s[len(refusal_s) // 2]:.3f}/"
          f"{refusal_s[-1]:.3f} s, 0 timeouts, 0 records for the refused")
