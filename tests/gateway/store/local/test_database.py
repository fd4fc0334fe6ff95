"""The local store's SQLite file is private to its user: it holds key hashes, the cache-salt
secret and the whole ledger."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gateway.store import open_store
from gateway.store.settings import StoreSettings


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    previous = os.umask(0o022)  # what most systems give a user: files 0644, folders 0755 unless asked
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_new_store_is_0600_in_a_0700_folder(tmp_path: Path) -> None:
    path = tmp_path / "made" / "by-edgerun" / "gateway.sqlite3"
    store = open_store(StoreSettings(sqlite_path=str(path)))
    try:
        await store.tenancy.create_tenant("acme", ["acc-1"], tenant_id="acme")  # writes the WAL
        assert mode(path.parent) == 0o700
        assert mode(path) == 0o600
        wal = path.with_name(path.name + "-wal")
        assert wal.exists() and mode(wal) == 0o600  # SQLite gives it the database's mode
    finally:
        await store.aclose()


async def test_an_existing_file_readable_by_others_is_tightened_and_logged(tmp_path: Path) -> None:
    folder = tmp_path / "existing"
    folder.mkdir(mode=0o755)
    path = folder / "gateway.sqlite3"
    first = open_store(StoreSettings(sqlite_path=str(path)))
    await first.tenancy.create_tenant("acme", ["acc-1"], tenant_id="acme")
    await first.aclose()
    path.chmod(0o644)  # e.g. made by an older edgerun
    with capture_logs() as logs:
        store = open_store(StoreSettings(sqlite_path=str(path)))
    try:
        assert mode(path) == 0o600
        assert mode(folder) == 0o755  # a folder edgerun did not create keeps its mode
        assert await store.tenancy.get_tenant("acme") is not None  # the data is still there
    finally:
        await store.aclose()
    warned = [entry for entry in logs if entry["log_level"] == "warning"]
    assert [(w["path"], w["was"]) for w in warned] == [(str(path), "0o644")]


async def test_a_ledger_from_before_the_hourly_sums_gets_them_built_once(tmp_path: Path) -> None:
    from gateway.store.ledger import hour_of
    from tests.gateway.store.test_ledger import T0, record

    path = tmp_path / "gateway.sqlite3"
    settings = StoreSettings(sqlite_path=str(path))
    first = open_store(settings)
    assert await first.ledger.append(record("r1", T0 + 5))
    assert await first.ledger.append(record("r2", T0 + 6, tenant_id="beta"))
    await first.aclose()
    with sqlite3.connect(path) as conn:  # as a file written before the sums existed
        conn.execute("DELETE FROM usage_hours")
        conn.execute("DELETE FROM meta WHERE key = 'hours_built'")
    again = open_store(settings)
    try:
        summed = await again.ledger.hours(hour_of(T0), hour_of(T0) + 3600)
        assert [sum(s.requests for s in h.groups.values()) for h in summed.hours] == [2]
        assert await again.ledger.append(record("r3", T0 + 7))  # and new records add to them, once
        summed = await again.ledger.hours(hour_of(T0), hour_of(T0) + 3600, "acme")
        assert [sum(s.requests for s in h.groups.values()) for h in summed.hours] == [2]
    finally:
        await again.aclose()


def test_one_batch_adds_each_new_record_to_its_hour_once(tmp_path: Path) -> None:
    """A group-committed batch sums its records per hour and key before writing them: the sums are
    those of record-by-record writes, a record already in the ledger adds nothing."""
    from gateway.store.ledger import hour_of
    from gateway.store.local.database import Database
    from tests.gateway.store.test_ledger import T0, record

    db = Database(str(tmp_path / "gateway.sqlite3"))
    try:
        first = [record("r1", T0 + 5), record("r2", T0 + 6), record("r3", T0 + 7, tenant_id="beta")]
        assert db.insert_usages(first, [10, 20, 30]) == [True, True, True]
        again = [record("r2", T0 + 6), record("r4", T0 + 8), record("r5", T0 + 3605)]  # r2 is a repeat
        assert db.insert_usages(again, [20, 40, 50]) == [False, True, True]
        hours = {h.hour: h for h in db.usage_hours(hour_of(T0), hour_of(T0) + 7200, None)}
        acme = [s for key, s in hours[hour_of(T0)].groups.items() if key.tenant_id == "acme"]
        assert [(s.requests, s.savings_micro) for s in acme] == [(3, 70)]  # r1, r2, r4
        assert sum(s.requests for s in hours[hour_of(T0)].groups.values()) == 4
        assert sum(s.prompt_tokens for s in hours[hour_of(T0)].groups.values()) == 4 * first[0].prompt_tokens
        assert sum(s.requests for s in hours[hour_of(T0) + 3600].groups.values()) == 1
    finally:
        db.close()
