from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import GatewaySettings
from gateway.store import InvalidArgument, Store, UsageRecord
from gateway.store.embedded import EmbeddedStore
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
    return [r async for r in store.iter_usage(start, end, tenant_id)]


async def test_append_once_read_back_exactly(store: Store) -> None:
    first = record("req-1", T0 + 0.123456)
    assert await store.append_usage(first) is True
    assert await store.append_usage(dataclasses.replace(first, cost_micro=999)) is False
    assert await store.get_usage("req-1") == first  # the first write stands
    assert await store.get_usage("req-2") is None
    odd = record("req:2/ü", T0, session_id=None, backend_id=None, region=None, status="rejected",
                 prompt_tokens=0, cached_tokens=0, completion_tokens=0, cost_micro=0, metadata={})
    assert await store.append_usage(odd) is True
    assert await store.get_usage("req:2/ü") == odd
    assert await collect(store, T0 - 10, T0 + 10) == [odd, first]


async def test_concurrent_duplicates_from_two_instances_write_one_record(open_instance: OpenStore) -> None:
    a, b = open_instance(), open_instance()  # embedded: two stores on one SQLite file
    copies = [record("req-dup", T0, cost_micro=c) for c in range(20)]
    results = await asyncio.gather(*(s.append_usage(r) for s, r in zip([a, b] * 10, copies)))
    assert sum(results) == 1
    winner = copies[results.index(True)]
    assert await collect(b, T0 - 1, T0 + 1) == [winner]
    assert await a.get_usage("req-dup") == winner


async def test_range_is_half_open_and_ordered_by_end_time_then_id(store: Store) -> None:
    ends = {"c": T0 + 2, "a": T0 + 2, "b": T0 + 1, "late": T0 + 3, "early": T0 - 0.000001, "edge": T0}
    for request_id, ended_at in ends.items():
        await store.append_usage(record(request_id, ended_at, tenant_id="beta" if request_id == "a" else "acme"))
    assert [r.request_id for r in await collect(store, T0, T0 + 3)] == ["edge", "b", "a", "c"]
    assert [r.request_id for r in await collect(store, T0, T0 + 3, "acme")] == ["edge", "b", "c"]
    assert [r.request_id for r in await collect(store, T0, T0 + 3, "beta")] == ["a"]
    assert await collect(store, T0 + 5, T0 + 9) == []
    assert await collect(store, T0 + 2, T0 + 2) == []


async def test_long_ranges_come_in_pages_without_gaps_or_repeats(store: Store) -> None:
    records = [record(f"r{i:05d}", T0 + (i // 3) * 0.001, tenant_id=("acme", "beta")[i % 2]) for i in range(1203)]
    for i in range(0, len(records), 100):  # written out of order, 100 at a time
        assert all(await asyncio.gather(*(store.append_usage(r) for r in records[::-1][i : i + 100])))
    assert [r.request_id for r in await collect(store, T0, T0 + 10)] == [r.request_id for r in records]
    assert len(await collect(store, T0, T0 + 10, "beta")) == 601


async def test_ledger_survives_reopen(open_instance: OpenStore) -> None:
    first = open_instance()
    await first.append_usage(record("req-1", T0))
    await first.aclose()
    second = open_instance()
    assert await second.append_usage(record("req-1", T0)) is False
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
        *(store.append_usage(twin) for twin in twins),
        *(store.append_usage(record(f"req-{i}", T0 + i)) for i in range(1, 40)),
    )
    assert sorted(results[:2]) == [False, True] and results[2:] == [True] * 39
    assert (await store.get_usage("req-a")) == twins[results.index(True)]
    assert len(await collect(store, T0 - 1, T0 + 50)) == 40


async def test_a_record_sqlite_cannot_take_fails_alone(tmp_path: Path) -> None:
    """Embedded only: appends that arrive together are committed together, but one record that
    SQLite refuses (an integer past 64 bits) must not take the others down with it."""
    store = EmbeddedStore(GatewaySettings(sqlite_path=str(tmp_path / "ledger.sqlite3")).store)
    try:
        results = await asyncio.gather(
            store.append_usage(record("ok-1", T0)),
            store.append_usage(record("too-big", T0, cost_micro=2**70)),
            store.append_usage(record("ok-2", T0)),
            return_exceptions=True,
        )
        assert results[0] is True and results[2] is True
        assert isinstance(results[1], OverflowError)
        assert [r.request_id for r in await collect(store, T0 - 1, T0 + 1)] == ["ok-1", "ok-2"]
    finally:
        await store.aclose()


async def test_closing_the_store_commits_what_was_queued(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.sqlite3")
    store = EmbeddedStore(GatewaySettings(sqlite_path=path).store)
    pending = [asyncio.create_task(store.append_usage(record(f"q-{i}", T0))) for i in range(5)]
    await asyncio.sleep(0)  # the appends are queued, maybe not yet written
    await store.aclose()
    assert all(await asyncio.gather(*pending))
    reopened = EmbeddedStore(GatewaySettings(sqlite_path=path).store)
    try:
        assert len(await collect(reopened, T0 - 1, T0 + 1)) == 5
    finally:
        await reopened.aclose()
