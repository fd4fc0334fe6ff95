"""`LocalAdapters`: finetunes in the local store's SQLite file (a table of its own), read on every call so
that the processes sharing the file agree."""

from __future__ import annotations

import sqlite3
from typing import Any

from gateway.store.adapters import Finetune
from gateway.store.errors import Conflict, NotFound
from gateway.store.local.file import LocalFile

_SCHEMA = """
CREATE TABLE IF NOT EXISTS finetunes (
    id TEXT PRIMARY KEY, account_id TEXT NOT NULL, name TEXT NOT NULL, data TEXT NOT NULL,
    created_at REAL NOT NULL, UNIQUE (account_id, name)
);
"""


class LocalAdapters:
    def __init__(self, file: LocalFile) -> None:
        self._file = file
        self._ready = False  # its table made (on first use: a file with no finetunes gets none)

    async def _run(self, fn: Any, *args: object) -> Any:
        """`fn(connection, *args)` on the file's worker thread, through the database's own connection."""
        run_with_connection = self._file.db.with_connection
        if not self._ready:
            await self._file.run(run_with_connection, sqlite3.Connection.executescript, _SCHEMA)
            self._ready = True
        return await self._file.run(run_with_connection, fn, *args)

    async def create_finetune(self, finetune: Finetune, max_per_account: int) -> None:
        await self._run(_create, finetune, max_per_account)

    async def get_finetune(self, account_id: str, name_or_id: str) -> Finetune | None:
        found: Finetune | None = await self._run(_get, account_id, name_or_id)
        return found

    async def list_finetunes(self, account_id: str) -> list[Finetune]:
        found: list[Finetune] = await self._run(_list, account_id)
        return found

    async def add_asset(self, account_id: str, finetune_id: str, file_name: str) -> Finetune:
        updated: Finetune = await self._run(_add_asset, account_id, finetune_id, file_name)
        return updated

    async def delete_finetune(self, account_id: str, finetune_id: str) -> bool:
        deleted: bool = await self._run(_delete, account_id, finetune_id)
        return deleted


def _create(conn: sqlite3.Connection, finetune: Finetune, max_per_account: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        (count,) = conn.execute("SELECT COUNT(*) FROM finetunes WHERE account_id = ?", (finetune.account_id,)).fetchone()
        if count >= max_per_account:
            raise Conflict(f"account {finetune.account_id} already has {count} finetunes, the most it may hold: "
                           "delete one first")
        try:
            conn.execute("INSERT INTO finetunes (id, account_id, name, data, created_at) VALUES (?, ?, ?, ?, ?)",
                         (finetune.id, finetune.account_id, finetune.name, finetune.to_json(), finetune.created_at))
        except sqlite3.IntegrityError as exc:
            raise Conflict(f"account {finetune.account_id} already has a finetune named {finetune.name!r}") from exc
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _get(conn: sqlite3.Connection, account_id: str, name_or_id: str) -> Finetune | None:
    row = conn.execute("SELECT data FROM finetunes WHERE account_id = ? AND (id = ? OR name = ?) "
                       "ORDER BY id = ? DESC LIMIT 1", (account_id, name_or_id, name_or_id, name_or_id)).fetchone()
    return None if row is None else Finetune.from_json(row[0])


def _list(conn: sqlite3.Connection, account_id: str) -> list[Finetune]:
    rows = conn.execute("SELECT data FROM finetunes WHERE account_id = ? ORDER BY created_at, id", (account_id,))
    return [Finetune.from_json(data) for (data,) in rows]


def _add_asset(conn: sqlite3.Connection, account_id: str, finetune_id: str, file_name: str) -> Finetune:
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT data FROM finetunes WHERE account_id = ? AND id = ?", (account_id, finetune_id)).fetchone()
        if row is None:
            raise NotFound(f"no finetune {finetune_id} in account {account_id}")
        updated = Finetune.from_json(row[0]).with_asset(file_name)
        conn.execute("UPDATE finetunes SET data = ? WHERE id = ?", (updated.to_json(), finetune_id))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return updated


def _delete(conn: sqlite3.Connection, account_id: str, finetune_id: str) -> bool:
    cursor = conn.execute("DELETE FROM finetunes WHERE account_id = ? AND id = ?", (account_id, finetune_id))
    return cursor.rowcount > 0
