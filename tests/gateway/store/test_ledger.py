"""The ledger (gateway/store/ledger.py): records exactly once, ranges, timings, per backend."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import GatewaySettings
from gateway.store import InvalidArgument, Store, UsageRecord, open_store
from tests.gateway.store.conftest import OpenStore

T0 = 1_780_000_000.0


def record(request_id: str, ended_at: float, tenant_id: str = "acme", **changes: Any) -> UsageRecord:
    base = UsageRecord(
        request_id=request_id, tenant_id=tenant_id, account_id="acct1", key_id="key_1",
        model="@cf/meta/llama-3.1-8b-instruct", region="eu", backend_id="eu-1", session_id="chat-1",
        started_at=ended_at - 1.25, ended_at=ended_at, status="ok", prompt_tokens=120, cached_tokens=64,
        completion_tokens=33, price_version="2026-05-01", cost_micro=41, metadata={"team": "search", "n": 3},
    )
    return dataclasses.replace(base, **changes)


async def collect(store: Store, start: float, end: float, tenant_id: str | None = None) -> list[UsageRecord]:
    return [r async for r in store.ledger.iter_usage(start, end, tenant_id)]


async def test_append_once_read_back_exactly(store: Store) -> None:
    first = record("req-1", T0 + 0.123456)
    assert await store.ledger.append(first) is True
    assert await store.ledger.append(dataclasses.replace(first, cost_micro=999)) is False
    assert await store.ledger.get("req-1") == first  # the first write stands
    assert await store.ledger.get("req-2") is None
    odd = record("req:2/ü", T0, session_id=None, backend_id=None, region=None, status="rejected",
                 prompt_tokens=0, cached_tokens=0, completion_tokens=0, cost_micro=0, metadata={})
    assert await store.ledger.append(odd) is True
    assert await store.ledger.get("req:2/ü") == odd
    assert await collect(store, T0 - 10, T0 + 10) == [odd, first]


async def test_concurrent_duplicates_from_two_instances_write_one_record(open_instance: OpenStore) -> None:
    a, b = open_instance(), open_instance()  # local: two stores on one SQLite file
    copies = [record("req-dup", T0, cost_micro=c) for c in range(20)]
    results = await asyncio.gather(*(s.ledger.append(r) for s, r in zip([a, b] * 10, copies)))
    assert sum(results) == 1
    winner = copies[results.index(True)]
    assert await collect(b, T0 - 1, T0 + 1) == [winner]
    assert await a.ledger.get("req-dup") == winner


async def test_range_is_half_open_and_ordered_by_end_time_then_id(store: Store) -> None:
    ends = {"c": T0 + 2, "a": T0 + 2, "b": T0 + 1, "late": T0 + 3, "early": T0 - 0.000001, "edge": T0}
    for request_id, ended_at in ends.items():
        await store.ledger.append(record(request_id, ended_at, tenant_id="beta" if request_id == "a" else "acme"))
    assert [r.request_id for r in await collect(store, T0, T0 + 3)] == ["edge", "b", "a", "c"]
    assert [r.request_id for r in await collect(store, T0, T0 + 3, "acme")] == ["edge", "b", "c"]
    assert [r.request_id for r in await collect(store, T0, T0 + 3, "beta")] == ["a"]
    assert await collect(store, T0 + 5, T0 + 9) == []
    assert await collect(store, T0 + 2, T0 + 2) == []


async def test_long_ranges_come_in_pages_without_gaps_or_repeats(store: Store) -> None:
    records = [record(f"r{i:05d}", T0 + (i // 3) * 0.001, tenant_id=("acme", "beta")[i % 2]) for i in range(1203)]
    for i in range(0, len(records), 100):  # written out of order, 100 at a time
        assert all(await asyncio.gather(*(store.ledger.append(r) for r in records[::-1][i : i + 100])))
    assert [r.request_id for r in await collect(store, T0, T0 + 10)] == [r.request_id for r in records]
    assert len(await collect(store, T0, T0 + 10, "beta")) == 601


async def test_ledger_survives_reopen(open_instance: OpenStore) -> None:
    first = open_instance()
    await first.ledger.append(record("req-1", T0))
    await first.aclose()
    second = open_instance()
    assert await second.ledger.append(record("req-1", T0)) is False
    assert [r.request_id for r in await collect(second, T0, T0 + 1)] == ["req-1"]


@pytest.mark.parametrize(
    "changes",
    [{"status": "done"}, {"prompt_tokens": -1}, {"cached_tokens": 500}, {"cost_micro": 1.5},
     {"request_id": ""}, {"tenant_id": "a:b"}, {"started_at": T0 + 5}, {"metadata": {"x": object()}}],
)
def test_bad_records_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        dataclasses.replace(record("req-1", T0), **changes)


async def test_concurrent_appends_each_learn_their_own_outcome(store: Store) -> None:
    twins = [record("req-a", T0), record("req-a", T0, cost_micro=7)]  # one request id, at the same moment
    results = await asyncio.gather(
        *(store.ledger.append(twin) for twin in twins),
        *(store.ledger.append(record(f"req-{i}", T0 + i)) for i in range(1, 40)),
    )
    assert sorted(results[:2]) == [False, True] and results[2:] == [True] * 39
    assert (await store.ledger.get("req-a")) == twins[results.index(True)]
    assert len(await collect(store, T0 - 1, T0 + 50)) == 40


async def test_a_record_sqlite_cannot_take_fails_alone(tmp_path: Path) -> None:
    """Local only: appends that arrive together are committed together, but one record that
    SQLite refuses (an integer past 64 bits) must not take the others down with it."""
    store = open_store(GatewaySettings(sqlite_path=str(tmp_path / "ledger.sqlite3")).store)
    try:
        results = await asyncio.gather(
            store.ledger.append(record("ok-1", T0)),
            store.ledger.append(record("too-big", T0, cost_micro=2**70)),
            store.ledger.append(record("ok-2", T0)),
            return_exceptions=True,
        )
        assert results[0] is True and results[2] is True
        assert isinstance(results[1], OverflowError)
        assert [r.request_id for r in await collect(store, T0 - 1, T0 + 1)] == ["ok-1", "ok-2"]
    finally:
        await store.aclose()


async def test_closing_the_store_commits_what_was_queued(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.sqlite3")
    store = open_store(GatewaySettings(sqlite_path=path).store)
    pending = [asyncio.create_task(store.ledger.append(record(f"q-{i}", T0))) for i in range(5)]
    await asyncio.sleep(0)  # the appends are queued, maybe not yet written
    await store.aclose()
    assert all(await asyncio.gather(*pending))
    reopened = open_store(GatewaySettings(sqlite_path=path).store)
    try:
        assert len(await collect(reopened, T0 - 1, T0 + 1)) == 5
    finally:
        await reopened.aclose()


async def test_timings_round_trip_and_old_records_read_as_none(store: Store) -> None:
    timed = record("req-timed", T0, ttft_s=0.123456, itl_s=0.0215)
    assert await store.ledger.append(timed)
    assert await store.ledger.get("req-timed") == timed
    untimed = record("req-untimed", T0 + 1)
    assert await store.ledger.append(untimed)
    assert (await store.ledger.get("req-untimed")).ttft_s is None  # type: ignore[union-attr]


def test_a_record_written_before_the_fields_existed_still_parses() -> None:
    fields = dataclasses.asdict(record("req-old", T0))
    del fields["ttft_s"], fields["itl_s"]
    old = UsageRecord.from_json(json.dumps(fields))
    assert old.ttft_s is None and old.itl_s is None and old.prompt_tokens == 120


@pytest.mark.parametrize("value", [-0.1, float("inf"), float("nan"), "0.2"])
def test_timings_must_be_finite_seconds(value: object) -> None:
    with pytest.raises(InvalidArgument, match="ttft_s"):
        record("req-bad", T0, ttft_s=value)


def test_a_record_encodes_every_field_sorted_and_compact_and_reads_back() -> None:
    timed = record("req-json", T0, ttft_s=0.5, itl_s=0.01)
    text = timed.to_json()
    assert text == json.dumps(dataclasses.asdict(timed), separators=(",", ":"), sort_keys=True)
    assert UsageRecord.from_json(text) == timed
