"""The local store's budget spends ride the ledger's transactions (gateway/store/local/budgets.py): one
commit per request instead of three, nothing lost on close, and a failed write loses no spend."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import gateway.store.local.budgets as budgets_module
from gateway.store import Store
from tests.gateway.store.calls import reserve_budget, settle_budget
from tests.gateway.store.local.test_writes_on_loop import (
    budget_book,
    local_file,
    open_store,
    spent_on_disk,
    wrap_writes,
)
from tests.gateway.store.test_ledger import record

MONTH = "2026-05"


async def until(condition: Callable[[], bool]) -> None:
    """Poll every 10 ms, up to a second, until `condition()` holds (what follows asserts the outcome)."""
    for _ in range(100):
        await asyncio.sleep(0.01)
        if condition():
            return


def count_calls(store: Store) -> dict[str, int]:
    """How many times each write of the store's two connections ran (loop or worker alike)."""
    calls = {"insert_usages": 0, "save_budgets": 0}

    def counted(_where: str, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: object) -> Any:
            calls[name] += 1
            return method(*args)

        return call

    wrap_writes(store, tuple(calls), counted)
    return calls


async def test_a_request_costs_one_commit_its_spend_with_its_record(tmp_path: Path) -> None:
    # (a settlement made before the record is written; Metering settles after: the next test)
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    calls = count_calls(store)
    try:
        assert (await reserve_budget(store, "acme", MONTH, 100, 1000)).allowed
        assert await settle_budget(store, "acme", MONTH, 100, 41) == 41
        assert await store.ledger.append(record("r1", 100.0, cost_micro=41))
        assert calls == {"insert_usages": 1, "save_budgets": 0}
        assert spent_on_disk(path, "acme", MONTH) == 41  # committed with the record, before append_usage returned
    finally:
        await store.aclose()


async def test_in_meterings_order_the_settlement_rides_the_next_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Metering.settle` writes the record first, then settles: the settlement goes with the next
    request's record (under load), or on its own BUDGET_SAVE_S later (a lone request: two commits)."""
    monkeypatch.setattr(budgets_module, "BUDGET_SAVE_S", 0.02)
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    calls = count_calls(store)
    try:
        await reserve_budget(store, "acme", MONTH, 100, 1000)
        assert await store.ledger.append(record("r1", 100.0, cost_micro=41))
        assert spent_on_disk(path, "acme", MONTH) == 100  # the reservation went with the record
        await settle_budget(store, "acme", MONTH, 100, 41)
        await until(lambda: calls["save_budgets"] > 0)
        assert calls == {"insert_usages": 1, "save_budgets": 1}
        assert spent_on_disk(path, "acme", MONTH) == 41
    finally:
        await store.aclose()


async def test_a_spend_no_record_follows_is_written_soon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(budgets_module, "BUDGET_SAVE_S", 0.02)
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    calls = count_calls(store)
    try:
        await reserve_budget(store, "acme", MONTH, 100, None)
        await reserve_budget(store, "acme", MONTH, 30, None)
        with pytest.raises(TypeError):  # nothing on disk yet
            spent_on_disk(path, "acme", MONTH)
        await until(lambda: calls["save_budgets"] > 0)
        await asyncio.sleep(0.01)
        assert calls["save_budgets"] == 1  # both changes in one write
        assert spent_on_disk(path, "acme", MONTH) == 130
    finally:
        await store.aclose()


async def test_close_writes_every_spend(tmp_path: Path) -> None:
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    await reserve_budget(store, "acme", MONTH, 100, None)
    await reserve_budget(store, "globex", MONTH, 7, None)
    await store.aclose()
    again = open_store(path)
    try:
        assert await again.admission.budget_spent("acme", MONTH) == 100
        assert await again.admission.budget_spent("globex", MONTH) == 7
    finally:
        await again.aclose()


async def test_a_failed_write_hands_its_spends_to_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record's transaction fails: neither the record nor the spends it carried are on disk, and
    the next write carries them."""
    monkeypatch.setattr(budgets_module, "BUDGET_SAVE_S", 3600.0)  # only the writes made here
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    try:
        await reserve_budget(store, "acme", MONTH, 100, None)
        failures = 0

        def broken(_where: str, _name: str, insert: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: object) -> Any:
                nonlocal failures
                failures += 1
                if failures <= 2:  # on the loop, then on the worker: both fail once
                    raise sqlite3.OperationalError("disk I/O error")
                return insert(*args)

            return call

        wrap_writes(store, ("insert_usages",), broken)
        with pytest.raises(Exception, match="disk I/O error"):
            await store.ledger.append(record("r1", 100.0))
        await reserve_budget(store, "globex", MONTH, 20, None)
        assert await store.ledger.append(record("r2", 101.0))
        assert spent_on_disk(path, "acme", MONTH) == 100  # handed back by the failed write
        assert spent_on_disk(path, "globex", MONTH) == 20
        assert await store.ledger.get("r1") is None
    finally:
        await store.aclose()


async def test_a_change_made_while_a_save_runs_is_written_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change whose timer fires while the previous timed save is still running (queued behind a slow
    call on the worker) is written once that save ends, not left in memory until the next record."""
    monkeypatch.setattr(budgets_module, "BUDGET_SAVE_S", 0.02)
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    release = threading.Event()
    try:
        busy = asyncio.ensure_future(local_file(store).run(release.wait, 5))  # the worker is busy ...
        await reserve_budget(store, "acme", MONTH, 100, None)
        await asyncio.sleep(0.06)  # ... so the timed save of 100 waits behind it
        assert budget_book(store)._saving is not None
        await reserve_budget(store, "acme", MONTH, 30, None)
        await asyncio.sleep(0.06)  # this change's timer fires while that save still runs
        release.set()
        await busy
        await until(lambda: budget_book(store)._saving is None and not budget_book(store)._unsaved)
        await asyncio.sleep(0.01)
        assert spent_on_disk(path, "acme", MONTH) == 130
    finally:
        release.set()
        await store.aclose()


async def test_a_spend_past_64_bits_is_refused_and_never_blocks_the_ledger(tmp_path: Path) -> None:
    """SQLite refused such a save when it was immediate; kept for later, it would fail every ledger
    transaction that carried it."""
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    try:
        await reserve_budget(store, "acme", MONTH, 2**63 - 10, None)
        with pytest.raises(OverflowError):
            await reserve_budget(store, "acme", MONTH, 10, None)
        assert await store.admission.budget_spent("acme", MONTH) == 2**63 - 10  # unchanged
        assert await store.ledger.append(record("r1", 100.0))
        assert spent_on_disk(path, "acme", MONTH) == 2**63 - 10
    finally:
        await store.aclose()


async def on_disk_within(path: Path, spent: int, limit_s: float) -> float:
    """Seconds until acme's spend on disk reads `spent` (fails past `limit_s`)."""
    started = time.monotonic()
    while True:
        with contextlib.suppress(TypeError):  # no row yet
            if spent_on_disk(path, "acme", MONTH) == spent:
                return time.monotonic() - started
        assert time.monotonic() - started < limit_s, f"acme's spend never reached {spent} on disk"
        await asyncio.sleep(0.005)


class BrokenSaves:
    """Makes the store's budget saves on their own fail (`broken`) and counts their tries; ledger
    transactions, which carry spends too, still work."""

    def __init__(self, store: Store) -> None:
        self.tries = 0
        self.broken = True
        wrap_writes(store, ("save_budgets",), self._failing)

    def _failing(self, where: str, _name: str, save: Callable[..., None]) -> Callable[..., None]:
        def call(*args: object) -> None:
            if self.broken:
                self.tries += where == "worker"  # the loop's failure goes on to the worker: one try each
                raise sqlite3.OperationalError("disk I/O error")
            save(*args)

        return call


def open_with_broken_saves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, retry_max_s: float
) -> tuple[Path, Store, BrokenSaves]:
    """A store whose BUDGET_SAVE_S is 0.01 s (the delay doubling up to `retry_max_s`), saves broken."""
    monkeypatch.setattr(budgets_module, "BUDGET_SAVE_S", 0.01)
    monkeypatch.setattr(budgets_module, "BUDGET_RETRY_MAX_S", retry_max_s)
    path = tmp_path / "gateway.sqlite3"
    store = open_store(path)
    return path, store, BrokenSaves(store)


async def test_failed_saves_back_off_and_a_good_one_resets_the_delay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file that keeps failing is tried again after 2x, 4x ... the delay (one warning each, not 20 a
    second); once it works, a change is written within BUDGET_SAVE_S again."""
    path, store, saves = open_with_broken_saves(tmp_path, monkeypatch, 0.16)
    try:
        await reserve_budget(store, "acme", MONTH, 100, None)
        await asyncio.sleep(0.6)  # 0.01 + 0.02 + 0.04 + 0.08 + 0.16 + 0.16 + ...: about 6 tries, not 60
        assert 3 <= saves.tries <= 8, saves.tries
        saves.broken = False
        assert await on_disk_within(path, 100, 5.0) < 0.5  # the next try, at most 0.16 s away, works
        await reserve_budget(store, "acme", MONTH, 5, None)
        assert await on_disk_within(path, 105, 5.0) < 0.1  # the delay is back to 0.01 s
    finally:
        await store.aclose()


async def test_a_good_ledger_write_resets_the_delay_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After failed saves, a ledger transaction that carries the spends shows the file works again:
    the next change no record follows is written within BUDGET_SAVE_S, not the backed-off delay (which
    only a good save on its own reset before, and under load the records take every spend along)."""
    path, store, saves = open_with_broken_saves(tmp_path, monkeypatch, 5.0)
    try:
        await reserve_budget(store, "acme", MONTH, 100, None)
        while saves.tries < 5:  # delays 0.02, 0.04, 0.08, 0.16, now 0.32 s
            await asyncio.sleep(0.005)
        saves.broken = False
        assert await store.ledger.append(record("r1", 100.0, cost_micro=41))
        assert spent_on_disk(path, "acme", MONTH) == 100  # the spend went with the record
        await asyncio.sleep(0.4)  # the timer armed before the record has fired, with nothing to save
        await reserve_budget(store, "acme", MONTH, 5, None)
        assert await on_disk_within(path, 105, 5.0) < 0.1  # within 0.01 s again, not 0.32
    finally:
        await store.aclose()
