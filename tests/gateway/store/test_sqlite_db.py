"""The embedded store's SQLite file is private to its user: it holds key hashes, the cache-salt
secret and the whole ledger."""

from __future__ import annotations

import os
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
        await store.create_tenant("acme", ["acc-1"], tenant_id="acme")  # writes the WAL
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
    await first.create_tenant("acme", ["acc-1"], tenant_id="acme")
    await first.aclose()
    path.chmod(0o644)  # e.g. made by an older edgerun
    with capture_logs() as logs:
        store = open_store(StoreSettings(sqlite_path=str(path)))
    try:
        assert mode(path) == 0o600
        assert mode(folder) == 0o755  # a folder edgerun did not create keeps its mode
        assert await store.get_tenant("acme") is not None  # the data is still there
    finally:
        await store.aclose()
    warned = [entry for entry in logs if entry["log_level"] == "warning"]
    assert [(w["path"], w["was"]) for w in warned] == [(str(path), "0o644")]
