"""The local store's SQLite file: what must survive a restart (tenants, key hashes, budgets, ledger
and the ledger's hourly sums).

Blocking and synchronous: the store calls it from one worker thread (local/file.py), so calls never
overlap. WAL journal, `synchronous=NORMAL` (a commit survives a process crash; an OS crash may
lose the last few), and a busy timeout so a second process reading the file waits instead of failing.

The file holds key hashes, the cache-salt secret and the whole ledger, so it is private to its
user: created 0600 (SQLite gives its -wal and -shm files the same mode) in a folder created 0700; a
file found readable by others is tightened to 0600, with a warning.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import structlog

from gateway.store.ledger import HOUR_S, HourUsage, UsageGroup, UsageSums, hour_of, to_latency_us
from gateway.store.models import ApiKey, Tenant, UsageRecord

T = TypeVar("T")

log = structlog.get_logger("edgerun.gateway.store")

USAGE_PAGE = 500  # ledger records read per query when iterating a range

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, allowed_models TEXT, monthly_budget_micro INTEGER,
    created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tenant_accounts (
    account_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id), position INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id), prefix TEXT NOT NULL,
    key_hash TEXT NOT NULL UNIQUE, allowed_models TEXT, rpm INTEGER, tpm INTEGER,
    created_at REAL NOT NULL, revoked_at REAL);
CREATE TABLE IF NOT EXISTS budget_spend (
    tenant_id TEXT NOT NULL, month TEXT NOT NULL, spent_micro INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, month));
CREATE TABLE IF NOT EXISTS usage (
    request_id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, ended_us INTEGER NOT NULL,
    cost_micro INTEGER NOT NULL, record TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS usage_by_time ON usage (ended_us, request_id);
CREATE INDEX IF NOT EXISTS usage_by_tenant_time ON usage (tenant_id, ended_us, request_id);
CREATE TABLE IF NOT EXISTS usage_hours (
    hour INTEGER NOT NULL, tenant_id TEXT NOT NULL, model TEXT NOT NULL, backend_id TEXT NOT NULL,
    region TEXT NOT NULL, status TEXT NOT NULL, price_version TEXT NOT NULL, requests INTEGER NOT NULL,
    prompt_tokens INTEGER NOT NULL, cached_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
    cost_micro INTEGER NOT NULL, savings_micro INTEGER NOT NULL,
    PRIMARY KEY (hour, tenant_id, model, backend_id, region, status, price_version)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS catalog_version (id INTEGER PRIMARY KEY CHECK (id = 0), version INTEGER NOT NULL);
INSERT OR IGNORE INTO catalog_version VALUES (0, 0);
CREATE TRIGGER IF NOT EXISTS tenant_added AFTER INSERT ON tenants
    BEGIN UPDATE catalog_version SET version = version + 1; END;
CREATE TRIGGER IF NOT EXISTS key_added AFTER INSERT ON api_keys
    BEGIN UPDATE catalog_version SET version = version + 1; END;
CREATE TRIGGER IF NOT EXISTS key_changed AFTER UPDATE ON api_keys
    BEGIN UPDATE catalog_version SET version = version + 1; END;
"""


def make_private(path: Path) -> None:
    """Make sure `path` exists and only its owner can read it (see the module doc)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # a folder that exists keeps its mode
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # an empty file: a new database
        return
    except FileExistsError:
        pass
    for file in (path, path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")):
        try:
            mode = stat.S_IMODE(file.stat().st_mode)
            if mode & 0o077:
                file.chmod(mode & 0o700)
                log.warning("the store's file was readable by others: now owner only", path=str(file), was=oct(mode))
        except FileNotFoundError:
            continue
        except OSError as exc:  # another user's file: say so, and open it as it is
            log.warning("cannot make the store's file private", path=str(file), error=repr(exc))


def _models_json(models: frozenset[str] | None) -> str | None:
    return None if models is None else json.dumps(sorted(models))


def _models_from(text: str | None) -> frozenset[str] | None:
    return None if text is None else frozenset(json.loads(text))


class Database:
    def __init__(
        self, path: str, *, synchronous: str = "NORMAL", busy_timeout_s: float = 5.0, autocheckpoint: bool = True
    ) -> None:
        """Open (creating) the file; `synchronous="FULL"` makes each commit survive an OS crash too;
        a write waits up to `busy_timeout_s` for another connection's (then sqlite3.OperationalError).
        `autocheckpoint=False`: commits never copy the WAL back into the file (which syncs it to disk);
        the owner calls `checkpoint` instead, where it may block."""
        if path != ":memory:":
            make_private(Path(path).expanduser())
            path = str(Path(path).expanduser())
        # Opened here, then used only by the store's single worker thread.
        self._conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={'FULL' if synchronous == 'FULL' else 'NORMAL'}")
        self._conn.execute("PRAGMA foreign_keys=ON")
        if not autocheckpoint:
            self._conn.execute("PRAGMA wal_autocheckpoint=0")
        self._conn.executescript(_SCHEMA)
        columns = {row[1] for row in self._conn.execute("PRAGMA table_info(tenants)")}
        if "max_concurrent_requests" not in columns:  # a file from before the column existed
            self._conn.execute("ALTER TABLE tenants ADD COLUMN max_concurrent_requests INTEGER")
        usage_columns = {row[1] for row in self._conn.execute("PRAGMA table_info(usage)")}
        for column in ("ttft_us", "itl_us"):  # a record's latencies, read by `usage_hours` (filled by `build_hours`)
            if column not in usage_columns:
                self._conn.execute(f"ALTER TABLE usage ADD COLUMN {column} INTEGER")

    def close(self) -> None:
        self._conn.close()

    def never_wait(self) -> None:
        """From now on a write that finds the file locked by another connection fails at once
        (sqlite3.OperationalError) instead of waiting up to the busy timeout."""
        self._conn.execute("PRAGMA busy_timeout=0")

    def checkpoint(self) -> None:
        """Copy what the WAL holds back into the file, as far as no reader still needs it (PASSIVE: it
        waits for no lock), so the WAL is written from its start again instead of growing."""
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def identity(self) -> str:
        """A random id made once per file, so processes can tell whether they share it."""
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self._conn.execute("INSERT OR IGNORE INTO meta VALUES ('id', ?)", (secrets.token_hex(8),))
        return str(self._conn.execute("SELECT value FROM meta WHERE key = 'id'").fetchone()[0])

    def with_connection(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(connection, *args)`: for a concern that keeps its own statements (local/adapters.py), on
        the thread this database is used from."""
        return fn(self._conn, *args)

    def catalog_version(self) -> int:
        """Goes up (by triggers, whoever writes) whenever a tenant or a key is added or changed, so a
        process can tell whether to read them again; other writes (the ledger, counters) leave it."""
        return int(self._conn.execute("SELECT version FROM catalog_version").fetchone()[0])

    def load_tenants_and_keys(self) -> tuple[int, list[Tenant], list[tuple[ApiKey, str]]]:
        """One consistent snapshot of tenants and keys, with the catalog version it was read at."""
        with self._conn:
            self._conn.execute("BEGIN")
            return self.catalog_version(), self.load_tenants(), self.load_keys()

    # --- tenants and keys: loaded whole at start, then written through ---

    def load_tenants(self) -> list[Tenant]:
        accounts: dict[str, list[str]] = {}
        for account_id, tenant_id in self._conn.execute(
            "SELECT account_id, tenant_id FROM tenant_accounts ORDER BY tenant_id, position"
        ):
            accounts.setdefault(tenant_id, []).append(account_id)
        rows = self._conn.execute(
            "SELECT id, name, allowed_models, monthly_budget_micro, created_at, max_concurrent_requests"
            " FROM tenants ORDER BY created_at, id"
        )
        return [
            Tenant(id=i, name=n, account_ids=tuple(accounts[i]), allowed_models=_models_from(m),
                   monthly_budget_micro=b, created_at=c, max_concurrent_requests=mc)
            for i, n, m, b, c, mc in rows
        ]

    def insert_tenant(self, tenant: Tenant) -> None:
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute(
                "INSERT INTO tenants (id, name, allowed_models, monthly_budget_micro, created_at,"
                " max_concurrent_requests) VALUES (?, ?, ?, ?, ?, ?)",
                (tenant.id, tenant.name, _models_json(tenant.allowed_models), tenant.monthly_budget_micro,
                 tenant.created_at, tenant.max_concurrent_requests),
            )
            self._conn.executemany(
                "INSERT INTO tenant_accounts VALUES (?, ?, ?)",
                [(a, tenant.id, i) for i, a in enumerate(tenant.account_ids)],
            )

    def load_keys(self) -> list[tuple[ApiKey, str]]:
        rows = self._conn.execute(
            "SELECT id, tenant_id, prefix, key_hash, allowed_models, rpm, tpm, created_at, revoked_at"
            " FROM api_keys ORDER BY created_at, id"
        )
        return [
            (ApiKey(id=i, tenant_id=t, prefix=p, allowed_models=_models_from(m), rpm=r, tpm=tp,
                    created_at=c, revoked_at=rv), h)
            for i, t, p, h, m, r, tp, c, rv in rows
        ]

    def insert_key(self, key: ApiKey, key_hash: str) -> None:
        self._conn.execute(
            "INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key.id, key.tenant_id, key.prefix, key_hash, _models_json(key.allowed_models), key.rpm, key.tpm,
             key.created_at, key.revoked_at),
        )

    def revoke_key(self, key_id: str, revoked_at: float) -> None:
        self._conn.execute(
            "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (revoked_at, key_id)
        )

    # --- budgets ---

    def load_budgets(self) -> dict[tuple[str, str], int]:
        rows = self._conn.execute("SELECT tenant_id, month, spent_micro FROM budget_spend")
        return {(t, m): s for t, m, s in rows}

    def save_budgets(self, spent: Mapping[tuple[str, str], int]) -> None:
        """Write each (tenant id, month)'s spend, in one transaction."""
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            _write_budgets(self._conn, spent)

    # --- server-side secrets ---

    def get_or_create_secret(self, name: str, candidate: str) -> str:
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            self._conn.execute("INSERT OR IGNORE INTO secrets VALUES (?, ?)", (name, candidate))
            (value,) = self._conn.execute("SELECT value FROM secrets WHERE name = ?", (name,)).fetchone()
        return str(value)

    # --- ledger ---

    def insert_usages(
        self,
        records: Sequence[UsageRecord],
        savings: Sequence[int],
        budgets: Mapping[tuple[str, str], int] | None = None,
    ) -> list[bool]:
        """Insert records (and add them to their hours' sums, `savings[i]` being record i's) in one
        transaction (one commit for all, or none on an error), with `budgets`' spends (as
        `save_budgets`) if given; for each record, True when written, False when its request id was
        already in the ledger."""
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            if budgets:
                _write_budgets(self._conn, budgets)
            return write_usages(self._conn, records, savings)

    def build_hours(self, savings: Callable[[UsageRecord], int]) -> int:
        """Sum the ledger's records into their hours, once per file (a file from before the sums
        existed); how many records were summed (0 when done before)."""
        with self._conn:
            self._conn.execute("BEGIN IMMEDIATE")
            if self._conn.execute("SELECT 1 FROM meta WHERE key = 'hours_built'").fetchone():
                return 0
            self._conn.execute("DELETE FROM usage_hours")
            count = 0
            hours = HourSums()
            for (text,) in self._conn.execute("SELECT record FROM usage").fetchall():
                record = UsageRecord.from_json(text)
                hours.add(record, savings(record))
                self._conn.execute("UPDATE usage SET ttft_us = ?, itl_us = ? WHERE request_id = ?",
                                   (*_latencies_us(record), record.request_id))
                count += 1
            hours.write(self._conn)
            self._conn.execute("INSERT INTO meta VALUES ('hours_built', '1')")
            return count

    def usage_hours(self, start_hour: int, end_hour: int, tenant_id: str | None) -> list[HourUsage]:
        """`Ledger.hours`: the sums of the hours in [start_hour, end_hour), oldest first. Latencies are
        counted from the records' own columns, by microsecond (a table of their own cost each record two
        more B-tree inserts)."""
        where = "hour >= ? AND hour < ?"
        args: list[object] = [start_hour, end_hour]
        if tenant_id is not None:
            where += " AND tenant_id = ?"
            args.append(tenant_id)
        hours: dict[int, HourUsage] = {}
        for hour, tenant, model, backend, region, status, version, *sums in self._conn.execute(
            "SELECT hour, tenant_id, model, backend_id, region, status, price_version, requests, prompt_tokens,"
            f" cached_tokens, completion_tokens, cost_micro, savings_micro FROM usage_hours WHERE {where}", args
        ):  # (hour, group) is the table's key: one row each
            usage = hours.get(hour) or hours.setdefault(hour, HourUsage(hour))
            usage.groups[UsageGroup(tenant, model, backend or None, region or None, status, version)] = UsageSums(*sums)
        span = [start_hour * 1_000_000, end_hour * 1_000_000, *args[2:]]
        by_tenant = " AND tenant_id = ?" if tenant_id is not None else ""
        for column in ("ttft_us", "itl_us"):
            for hour_index, value, count in self._conn.execute(
                f"SELECT ended_us / {HOUR_S * 1_000_000}, {column}, count(*) FROM usage"
                f" WHERE ended_us >= ? AND ended_us < ?{by_tenant} AND {column} IS NOT NULL GROUP BY 1, 2",
                span,
            ):
                hour = hour_index * HOUR_S
                usage = hours.get(hour) or hours.setdefault(hour, HourUsage(hour))
                (usage.ttft_us if column == "ttft_us" else usage.itl_us)[value] = count
        return [hours[h] for h in sorted(hours)]

    def usage_page(
        self, start_us: int, end_us: int, tenant_id: str | None, after: tuple[int, str] | None, limit: int
    ) -> list[UsageRecord]:
        """Up to `limit` records in [start_us, end_us) ordered by (ended_us, request_id), after `after`."""
        where = ["ended_us >= ?", "ended_us < ?"]
        args: list[object] = [start_us, end_us]
        if tenant_id is not None:
            where.append("tenant_id = ?")
            args.append(tenant_id)
        if after is not None:
            where.append("(ended_us, request_id) > (?, ?)")
            args.extend(after)
        sql = f"SELECT record FROM usage WHERE {' AND '.join(where)} ORDER BY ended_us, request_id LIMIT ?"
        return [UsageRecord.from_json(r) for (r,) in self._conn.execute(sql, (*args, limit))]

    async def iter_usage(
        self, run: Callable[..., Awaitable[list[UsageRecord]]], start_us: int, end_us: int, tenant_id: str | None
    ) -> AsyncIterator[UsageRecord]:
        """Every record of `usage_page`'s range, a page of `USAGE_PAGE` at a time, each read through `run`
        (the owner's worker thread)."""
        after: tuple[int, str] | None = None
        while True:
            page = await run(self.usage_page, start_us, end_us, tenant_id, after, USAGE_PAGE)
            for record in page:
                yield record
            if len(page) < USAGE_PAGE:
                return
            after = (page[-1].ended_us, page[-1].request_id)

    def get_usage(self, request_id: str) -> UsageRecord | None:
        row = self._conn.execute("SELECT record FROM usage WHERE request_id = ?", (request_id,)).fetchone()
        return None if row is None else UsageRecord.from_json(row[0])


def _write_budgets(conn: sqlite3.Connection, spent: Mapping[tuple[str, str], int]) -> None:
    conn.executemany(
        "INSERT INTO budget_spend VALUES (?, ?, ?)"
        " ON CONFLICT (tenant_id, month) DO UPDATE SET spent_micro = excluded.spent_micro",
        [(tenant_id, month, micro) for (tenant_id, month), micro in spent.items()],
    )


def write_usages(conn: sqlite3.Connection, records: Sequence[UsageRecord], savings: Sequence[int]) -> list[bool]:
    """Insert records in the caller's transaction on `conn` (the shared mode's group transaction, or
    `Database.insert_usages`'s own), the ones written added to their hours' sums (one upsert per hour
    and key for the whole batch); for each, True when written, False when its request id was there."""
    written = []
    hours = HourSums()
    for record, saved in zip(records, savings, strict=True):
        cursor = conn.execute(
            "INSERT OR IGNORE INTO usage (request_id, tenant_id, ended_us, cost_micro, record, ttft_us, itl_us)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.request_id, record.tenant_id, record.ended_us, record.cost_micro, record.to_json(),
             *_latencies_us(record)),
        )
        if cursor.rowcount == 1:
            hours.add(record, saved)
        written.append(cursor.rowcount == 1)
    hours.write(conn)
    return written


def _latencies_us(record: UsageRecord) -> tuple[int | None, int | None]:
    return (None if record.ttft_s is None else to_latency_us(record.ttft_s),
            None if record.itl_s is None else to_latency_us(record.itl_s))


class HourSums:
    """Records' sums by hour and key (`Ledger.hours`; latencies are the records' own columns), added
    to the file's `usage_hours` in one statement."""

    def __init__(self) -> None:
        self._sums: dict[tuple[int, str, str, str, str, str, str], list[int]] = {}

    def add(self, record: UsageRecord, savings_micro: int) -> None:
        key = (hour_of(record.ended_at), record.tenant_id, record.model, record.backend_id or "", record.region or "",
               record.status, record.price_version)
        values = (1, record.prompt_tokens, record.cached_tokens, record.completion_tokens, record.cost_micro,
                  savings_micro)
        sums = self._sums.get(key)
        self._sums[key] = list(values) if sums is None else [s + v for s, v in zip(sums, values)]

    def write(self, conn: sqlite3.Connection) -> None:
        if not self._sums:
            return
        conn.executemany(
            "INSERT INTO usage_hours VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT DO UPDATE SET requests = requests + excluded.requests,"
            " prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
            " cached_tokens = cached_tokens + excluded.cached_tokens,"
            " completion_tokens = completion_tokens + excluded.completion_tokens,"
            " cost_micro = cost_micro + excluded.cost_micro, savings_micro = savings_micro + excluded.savings_micro",
            [(*key, *sums) for key, sums in self._sums.items()],
        )
        self._sums.clear()
