"""The ledger spool: records survive a ledger outage and are replayed exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cli.processes import free_port
from contracts.usage import Usage
from gateway.billing.metering import MeteredRequest, Metering, Reservation
from gateway.billing.spool import LedgerSpool, replay_forever
from gateway.context import Principal
from gateway.fleet.catalog import ModelSpec
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from gateway.store import Store, StoreUnavailable, open_store
from gateway.store.models import ApiKey, Tenant, UsageRecord
from policies.pricing import PriceTable
from tests.gateway.fixtures_context import context_now

PRICES = PriceTable.from_config({"m": {"version": "v1", "input": "0.60", "cached_input": "0.10", "output": "3"}})


def record(request_id: str, ended_at: float = 1_800_000_000.0) -> UsageRecord:
    return UsageRecord(
        request_id=request_id, tenant_id="ta", account_id="acc", key_id="k1", model="m", region="r",
        backend_id="b1", session_id=None, started_at=ended_at - 1, ended_at=ended_at, status="ok",
        prompt_tokens=100, cached_tokens=50, completion_tokens=5, price_version="v1", cost_micro=50,
        metadata={"job": "nightly"},
    )


@pytest.fixture
async def down_store() -> AsyncIterator[Store]:
    """A Redis store whose server is not there (a real refused connection)."""
    settings = GatewaySettings(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_timeout_s=0.5)
    opened = open_store(settings.store)
    yield opened
    await opened.aclose()


async def ledger(store: Store) -> list[str]:
    return [r.request_id async for r in store.ledger.iter_usage(0, 2e9)]


async def test_replaying_twice_writes_each_record_once(store: Store, tmp_path: Path) -> None:
    spool = LedgerSpool(tmp_path / "spool.jsonl")
    for i in range(3):
        spool.append(record(f"r{i}"))
    assert spool.pending()
    first = await spool.replay(store.ledger)
    assert (first.written, first.duplicates, first.complete) == (3, 0, True)
    assert not spool.pending() and sorted(p.name for p in tmp_path.glob("spool*")) == ["spool.jsonl.lock"]
    spool.append(record("r1"))  # the same record spooled again (its first write did land after all)
    second = await spool.replay(store.ledger)
    assert (second.written, second.duplicates) == (0, 1)
    assert await ledger(store) == ["r0", "r1", "r2"]
    assert (await store.ledger.get("r0")) == record("r0")  # every field survives the round trip


async def test_a_replay_cut_short_by_a_crash_resumes_without_doubles(
    store: Store, tmp_path: Path
) -> None:
    spool = LedgerSpool(tmp_path / "spool.jsonl")
    for i in range(4):
        spool.append(record(f"r{i}"))
    rotated = spool._rotate()  # the crash: rotated, two records replayed, then the process died
    assert rotated is not None and not spool.path.exists()
    await store.ledger.append(record("r0"))
    await store.ledger.append(record("r1"))
    spool.append(record("r4"))  # a new outage after the restart
    result = await spool.replay(store.ledger)
    assert (result.written, result.duplicates, result.complete) == (3, 2, True)
    assert await ledger(store) == [f"r{i}" for i in range(5)] and not spool.pending()


async def test_a_store_still_down_keeps_the_records(
    store: Store, down_store: Store, tmp_path: Path
) -> None:
    spool = LedgerSpool(tmp_path / "spool.jsonl")
    spool.append(record("r0"))
    spool.append(record("r1"))
    failed = await spool.replay(down_store.ledger)
    assert (failed.written, failed.complete) == (0, False) and spool.pending()
    spool.append(record("r2"))  # appended while the first batch waits
    done = await spool.replay(store.ledger)
    assert (done.written, done.complete) == (3, True) and await ledger(store) == ["r0", "r1", "r2"]


async def test_a_line_cut_by_a_crash_is_set_aside_and_the_next_record_kept(
    store: Store, tmp_path: Path
) -> None:
    spool = LedgerSpool(tmp_path / "spool.jsonl")
    spool.append(record("r0"))
    with open(spool.path, "ab") as f:
        f.write(record("torn").to_json().encode()[:40])  # no newline: the writer died mid-line
    spool.append(record("r1"))
    result = await spool.replay(store.ledger)
    assert (result.written, result.corrupt) == (2, 1) and await ledger(store) == ["r0", "r1"]
    assert (tmp_path / "spool.jsonl.corrupt").read_bytes().startswith(b'{"account_id"')


async def test_metering_spools_when_the_ledger_is_down_and_never_raises_on_the_budget(
    store: Store, down_store: Store, tmp_path: Path
) -> None:
    tenant = Tenant("ta", "A", ("acc",), None, None, time.time())
    key = ApiKey("k1", "ta", "edg_x", None, None, None, time.time())
    model = ModelSpec(id="m", backend_model="m")
    request = MeteredRequest(context_now("req-1", Principal(key, tenant, "acc"), model, "s1"), 1000)
    request.reservation = Reservation(time.strftime("%Y-%m"), 900)  # reserved before Redis went away
    spool = LedgerSpool(tmp_path / "spool.jsonl")
    metrics = GatewayMetrics()
    metering = Metering(down_store, PRICES, metrics, spool)
    assert await metering.settle(request, Usage(1000, 10, 800), status="ok", backend_id="b1", region="r")
    assert 'edgerun_gateway_usage_records_total{outcome="spooled"} 1.0' in metrics.render().decode()
    assert (await spool.replay(store.ledger)).written == 1
    replayed = await store.ledger.get("req-1")
    assert replayed is not None and (replayed.cost_micro, replayed.session_id) == (230, "s1")

    with pytest.raises(StoreUnavailable):  # without a spool there is nowhere to keep it: the caller hears
        await Metering(down_store, PRICES, metrics).settle(
            request, Usage(1, 1, 0), status="ok", backend_id="b1", region="r"
        )


async def test_the_background_task_replays_at_start_up(store: Store, tmp_path: Path) -> None:
    spool = LedgerSpool(tmp_path / "spool.jsonl")
    spool.append(record("r0"))
    task = asyncio.create_task(replay_forever(spool, store.ledger, interval_s=0.05))
    try:
        deadline = time.monotonic() + 5
        while await store.ledger.get("r0") is None:
            assert time.monotonic() < deadline, "the spool was not replayed"
            await asyncio.sleep(0.02)
        spool.append(record("r1"))  # and keeps replaying while it runs
        while await store.ledger.get("r1") is None:
            assert time.monotonic() < deadline, "the spool was not replayed"
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
