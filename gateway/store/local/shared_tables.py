"""The counters several gateway processes share through one SQLite file (the local store's shared mode).

Rate-limit windows, per-tenant request slots, in-flight tokens, sessions and the prefix index,
in tables next to the local store's own (database.py) in the same WAL-mode file. Every
check-and-change runs in a `BEGIN IMMEDIATE` transaction: SQLite lets one connection write at a
time, so the read, the decision and the write of one process never interleave with another's.
Grouped (what the store uses), consecutive calls share one transaction, each in a savepoint,
until `commit`: one lock and one commit for many calls, where each request made six write
transactions (less CPU per request; the workers' throughput cap stayed: BENCHMARKS.md, "Workers and stores").
A writer that finds the file locked waits up to `busy_timeout_s` (then `sqlite3.OperationalError`).

Blocking and synchronous, one connection: the store calls it from its one worker thread.
Leases: each process (replica) has a row in `replicas` with `lease_until` (wall clock, shared by
the processes of one machine), renewed by the store. Slots and in-flight tokens belong to a
replica and stop counting once its lease has run out: a killed worker's counts vanish within
`inflight_lease_s`, as with Redis.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from gateway.store.admission import Claim, Inflight, Release
from gateway.store.local.database import write_usages
from gateway.store.local.tables import leading_runs
from gateway.store.models import UsageRecord
from gateway.store.routing import Loads, RouteView
from policies.limits import WindowRule, sliding_window, window_index

_SCHEMA = """
CREATE TABLE IF NOT EXISTS limit_windows (
    scope TEXT PRIMARY KEY, idx INTEGER NOT NULL, current INTEGER NOT NULL, previous INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS replicas (replica TEXT PRIMARY KEY, lease_until REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS request_slots (
    tenant_id TEXT NOT NULL, request_id TEXT NOT NULL, replica TEXT NOT NULL,
    PRIMARY KEY (tenant_id, request_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS request_slots_by_replica ON request_slots (replica);
CREATE TABLE IF NOT EXISTS inflight (
    replica TEXT NOT NULL, backend_id TEXT NOT NULL, prefill INTEGER NOT NULL, decode INTEGER NOT NULL,
    PRIMARY KEY (replica, backend_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS sessions (
    tenant_id TEXT NOT NULL, session_id TEXT NOT NULL, backend_id TEXT NOT NULL, expires REAL NOT NULL,
    PRIMARY KEY (tenant_id, session_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_by_expiry ON sessions (expires);
CREATE TABLE IF NOT EXISTS prefix_blocks (hash INTEGER PRIMARY KEY, seq INTEGER NOT NULL, seen REAL NOT NULL);
CREATE INDEX IF NOT EXISTS prefix_blocks_by_seq ON prefix_blocks (seq);
CREATE INDEX IF NOT EXISTS prefix_blocks_by_seen ON prefix_blocks (seen);
CREATE TABLE IF NOT EXISTS prefix_holders (
    hash INTEGER NOT NULL REFERENCES prefix_blocks(hash) ON DELETE CASCADE, backend_id TEXT NOT NULL,
    seen REAL NOT NULL, PRIMARY KEY (hash, backend_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS shared_counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
INSERT OR IGNORE INTO shared_counters VALUES ('prefix_blocks', 0), ('prefix_seq', 0);
"""
_MAX_VARIABLES = 500  # hashes per IN (...) query
_RETRY_S = 0.0002  # grouped: between two tries for the write lock (see `_begin`)
_SWEEP_EVERY = 4096  # rate-limit decisions between two sweeps of old windows


class SharedTables:
    def __init__(self, path: str, replica: str, *, busy_timeout_s: float = 5.0, grouped: bool = False) -> None:
        """Open the file (created if needed, WAL) and its shared tables; `replica` names this process's counts.

        `grouped`: a write leaves its transaction open, so the next ones join it, until `commit` (each
        write in its own savepoint: one that fails undoes only its own changes). The store's worker
        thread commits after a run of calls (serial_worker.py `run_grouped`): one lock and one commit
        for many requests' writes."""
        Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        self.replica = replica
        self._grouped = grouped
        self._busy_timeout_s = busy_timeout_s
        self._lease_written = False  # grouped: this replica's lease is already renewed in the open transaction
        self._num_checks = 0
        self._conn = sqlite3.connect(
            str(Path(path).expanduser()), timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA foreign_keys=ON")
        self._conn.executescript(_SCHEMA)  # idempotent; a process creating it meanwhile makes this one wait

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (`BEGIN IMMEDIATE`): no other process writes until it ends
        (grouped: a savepoint in the open transaction, begun here if none is)."""
        conn = self._conn
        if not self._grouped:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return
        if not conn.in_transaction:
            self._begin()
            self._lease_written = False
        conn.execute("SAVEPOINT call")
        try:
            yield conn
        except BaseException:
            self._lease_written = False  # the lease may have been written in what is undone now
            if conn.in_transaction:  # an I/O error may have rolled back the whole transaction already
                conn.execute("ROLLBACK TO call")
                conn.execute("RELEASE call")
            raise
        conn.execute("RELEASE call")

    def _begin(self) -> None:
        """`BEGIN IMMEDIATE`, tried again every `_RETRY_S` until the busy timeout. SQLite's own wait
        sleeps 1, 2, 5, 10 ... 100 ms between tries: with several workers the lock sat free while they
        slept (8 processes on one file: worst wait 55-82 ms that way, 12-14 ms retrying every 0.2 ms)."""
        deadline = time.monotonic() + self._busy_timeout_s
        self._conn.execute("PRAGMA busy_timeout = 0")
        try:
            while True:
                try:
                    self._conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                        raise
                time.sleep(_RETRY_S)
        finally:
            self._conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")

    def commit(self) -> None:
        """End the open group transaction, if any (grouped mode); on failure nothing of it is kept."""
        if not self._conn.in_transaction:
            return
        try:
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

    # --- replicas and their leases ---

    def renew_lease(self, lease_s: float, max_sessions: int) -> None:
        """Keep this replica's slots and in-flight tokens counted for `lease_s` more; also drops
        what is over: dead replicas' leftovers, expired sessions (then the oldest past `max_sessions`)."""
        now = time.time()
        with self._write() as conn:
            self._touch(conn, now, lease_s)
            dead = [r for (r,) in conn.execute("SELECT replica FROM replicas WHERE lease_until <= ?", (now,))]
            for replica in dead:
                self._forget(conn, replica)
            conn.execute("DELETE FROM sessions WHERE expires <= ?", (now,))
            (num_sessions,) = conn.execute("SELECT count(*) FROM sessions").fetchone()
            if num_sessions > max_sessions:  # all share one TTL: the earliest expiry was written longest ago
                conn.execute(
                    "DELETE FROM sessions WHERE (tenant_id, session_id) IN"
                    " (SELECT tenant_id, session_id FROM sessions ORDER BY expires LIMIT ?)",
                    (num_sessions - max_sessions,),
                )

    def drop_replica(self) -> None:
        """A clean close: this replica's slots and in-flight tokens end now."""
        with self._write() as conn:
            self._forget(conn, self.replica)
            self._lease_written = False

    def _touch(self, conn: sqlite3.Connection, now: float, lease_s: float) -> None:
        """Renew this replica's lease (grouped: once per transaction, the calls of one group are µs apart)."""
        if self._lease_written:
            return
        self._lease_written = self._grouped
        conn.execute(
            "INSERT INTO replicas VALUES (?, ?) ON CONFLICT (replica) DO UPDATE SET lease_until = excluded.lease_until",
            (self.replica, now + lease_s),
        )

    @staticmethod
    def _forget(conn: sqlite3.Connection, replica: str) -> None:
        conn.execute("DELETE FROM inflight WHERE replica = ?", (replica,))
        conn.execute("DELETE FROM request_slots WHERE replica = ?", (replica,))
        conn.execute("DELETE FROM replicas WHERE replica = ?", (replica,))

    # --- admission: one request's checks and takes, and its releases, each in one savepoint ---

    def check_and_consume(
        self, scopes: Sequence[tuple[str, int, int]], now_ms: int, window_ms: int
    ) -> dict[str, int | None]:
        """For each (scope, limit, cost): its retry_after_ms when refused (None: it would never fit),
        or 0 when allowed. Counts every cost only when all are allowed, in the same transaction."""
        with self._write() as conn:
            return self._consume(conn, scopes, now_ms, window_ms)

    def admit(self, claim: Claim, tpm_scope: str, now_ms: int, window_ms: int, lease_s: float
              ) -> tuple[str | None, int | None, int]:
        """`Admission.admit` in one savepoint: (the part that refused or None, the tpm retry in ms,
        the month's spend after)."""
        now = time.time()
        with self._write() as conn:
            if claim.slot_limit is not None or claim.inflight is not None:
                self._touch(conn, now, lease_s)
            if claim.slot_limit is not None and not self._slot_free(conn, claim, now):
                return "slot", None, 0
            if claim.tpm is not None:
                retry = self._consume(conn, [(tpm_scope, claim.tpm, claim.tokens)], now_ms, window_ms)[tpm_scope]
                if retry != 0:
                    return "tpm", retry, 0
            spent = 0
            if claim.month is not None:
                spent = self._spent(conn, claim.tenant_id, claim.month)
                if claim.budget_micro is not None and spent + claim.amount_micro > claim.budget_micro:
                    return "budget", None, spent
                spent += claim.amount_micro
                self._save_spent(conn, claim.tenant_id, claim.month, spent)
            if claim.slot_limit is not None:
                conn.execute("INSERT OR IGNORE INTO request_slots VALUES (?, ?, ?)",
                             (claim.tenant_id, claim.request_id, self.replica))
            if claim.inflight is not None:
                self._change_inflight(conn, claim.inflight, 1)
            return None, None, spent

    def settle(self, release: Release, tpm_scope: str, now_ms: int, window_ms: int, lease_s: float,
               records: Sequence[UsageRecord], savings: Sequence[int]) -> list[bool]:
        """`Admission.settle` in one savepoint: the releases, then the records (`insert_usages`)."""
        with self._write() as conn:
            if release.slot:
                conn.execute("DELETE FROM request_slots WHERE tenant_id = ? AND request_id = ?",
                             (release.tenant_id, release.request_id))
            if release.tokens_delta:
                self._add_to_window(conn, tpm_scope, release.tokens_delta, now_ms, window_ms)
            if release.month is not None:
                spent = max(0, self._spent(conn, release.tenant_id, release.month)
                            + release.cost_micro - release.reserved_micro)
                self._save_spent(conn, release.tenant_id, release.month, spent)
            if release.inflight is not None:
                self._touch(conn, time.time(), lease_s)
                self._change_inflight(conn, release.inflight, -1)
            return write_usages(conn, records, savings)

    def budget_spent(self, tenant_id: str, month: str) -> int:
        return self._spent(self._conn, tenant_id, month)

    def _consume(
        self, conn: sqlite3.Connection, scopes: Sequence[tuple[str, int, int]], now_ms: int, window_ms: int
    ) -> dict[str, int | None]:
        index = window_index(now_ms, window_ms)
        retries: dict[str, int | None] = {}
        self._num_checks += 1
        if self._num_checks % _SWEEP_EVERY == 0:  # keys gone quiet: their windows are over
            conn.execute("DELETE FROM limit_windows WHERE idx < ?", (index - 1,))
        counts = {scope: self._window(conn, scope, index) for scope, _, _ in scopes}
        for scope, limit, cost in scopes:
            previous, current = counts[scope]
            decision = sliding_window(previous, current, cost, WindowRule(limit, window_ms), now_ms)
            retries[scope] = 0 if decision.allowed else decision.retry_after_ms
        if all(retry == 0 for retry in retries.values()):
            for scope, _, cost in scopes:
                previous, current = counts[scope]
                self._save_window(conn, scope, index, current + cost, previous)
        return retries

    def _add_to_window(self, conn: sqlite3.Connection, scope: str, delta: int, now_ms: int, window_ms: int) -> None:
        """Add `delta` to the current window; a negative one takes from current, then previous, down to 0."""
        index = window_index(now_ms, window_ms)
        previous, current = self._window(conn, scope, index)
        if delta >= 0:
            current += delta
        else:
            take = min(current, -delta)
            current, previous = current - take, max(0, previous - (-delta - take))
        self._save_window(conn, scope, index, current, previous)

    @staticmethod
    def _window(conn: sqlite3.Connection, scope: str, index: int) -> tuple[int, int]:
        """(previous, current) counts of the window `index` (a caller behind the stored window counts in it)."""
        row = conn.execute("SELECT idx, current, previous FROM limit_windows WHERE scope = ?", (scope,)).fetchone()
        if row is None:
            return 0, 0
        stored, current, previous = row
        if index <= stored:
            return previous, current
        return (current, 0) if index == stored + 1 else (0, 0)

    @staticmethod
    def _save_window(conn: sqlite3.Connection, scope: str, index: int, current: int, previous: int) -> None:
        conn.execute(
            "INSERT INTO limit_windows VALUES (?, ?, ?, ?) ON CONFLICT (scope) DO UPDATE SET"
            " idx = max(idx, excluded.idx), current = excluded.current, previous = excluded.previous",
            (scope, index, current, previous),
        )

    @staticmethod
    def _spent(conn: sqlite3.Connection, tenant_id: str, month: str) -> int:
        """The month's spend: the local store's `budget_spend` row, read and written in one transaction."""
        row = conn.execute(
            "SELECT spent_micro FROM budget_spend WHERE tenant_id = ? AND month = ?", (tenant_id, month)
        ).fetchone()
        return 0 if row is None else int(row[0])

    @staticmethod
    def _save_spent(conn: sqlite3.Connection, tenant_id: str, month: str, spent: int) -> None:
        conn.execute(
            "INSERT INTO budget_spend VALUES (?, ?, ?)"
            " ON CONFLICT (tenant_id, month) DO UPDATE SET spent_micro = excluded.spent_micro",
            (tenant_id, month, spent),
        )

    @staticmethod
    def _slot_free(conn: sqlite3.Connection, claim: Claim, now: float) -> bool:
        """The request holds its slot already, or fewer than the limit are held by live replicas."""
        assert claim.slot_limit is not None
        if conn.execute(
            "SELECT 1 FROM request_slots WHERE tenant_id = ? AND request_id = ?", (claim.tenant_id, claim.request_id)
        ).fetchone():
            return True
        (held,) = conn.execute(
            "SELECT count(*) FROM request_slots JOIN replicas USING (replica) WHERE tenant_id = ? AND lease_until > ?",
            (claim.tenant_id, now),
        ).fetchone()
        return bool(held < claim.slot_limit)

    # --- in-flight tokens per backend, per replica ---

    def change_inflight(self, inflight: Inflight, sign: int, lease_s: float) -> None:
        """Add (1) or take away (-1, stopping at 0) this replica's tokens in flight to a backend."""
        with self._write() as conn:
            self._touch(conn, time.time(), lease_s)
            self._change_inflight(conn, inflight, sign)

    def _change_inflight(self, conn: sqlite3.Connection, inflight: Inflight, sign: int) -> None:
        row = conn.execute(
            "SELECT prefill, decode FROM inflight WHERE replica = ? AND backend_id = ?", (self.replica, inflight.backend_id)
        ).fetchone()
        held = (0, 0) if row is None else row
        self._put_inflight(conn, inflight.backend_id, max(0, held[0] + sign * inflight.prefill_tokens),
                           max(0, held[1] + sign * inflight.decode_tokens))

    def correct_inflight(self, backend_id: str, prefill: int, decode: int, lease_s: float) -> None:
        """Set this replica's share to the backend's report minus the other live replicas' counts (at least 0)."""
        now = time.time()
        with self._write() as conn:
            self._touch(conn, now, lease_s)
            other_p, other_d = conn.execute(
                "SELECT coalesce(sum(prefill), 0), coalesce(sum(decode), 0) FROM inflight JOIN replicas USING (replica)"
                " WHERE backend_id = ? AND replica != ? AND lease_until > ?",
                (backend_id, self.replica, now),
            ).fetchone()
            self._put_inflight(conn, backend_id, max(0, prefill - other_p), max(0, decode - other_d))

    def _put_inflight(self, conn: sqlite3.Connection, backend_id: str, prefill: int, decode: int) -> None:
        if prefill == 0 and decode == 0:
            conn.execute("DELETE FROM inflight WHERE replica = ? AND backend_id = ?", (self.replica, backend_id))
            return
        conn.execute(
            "INSERT INTO inflight VALUES (?, ?, ?, ?) ON CONFLICT (replica, backend_id)"
            " DO UPDATE SET prefill = excluded.prefill, decode = excluded.decode",
            (self.replica, backend_id, prefill, decode),
        )

    def loads(self) -> Loads:
        """backend -> (prefill, decode) summed over the replicas whose lease has not run out."""
        rows = self._conn.execute(
            "SELECT backend_id, sum(prefill), sum(decode) FROM inflight JOIN replicas USING (replica)"
            " WHERE lease_until > ? GROUP BY backend_id",
            (time.time(),),
        )
        return {b: (p, d) for b, p, d in rows if p or d}

    # --- routing: one request's reads, and what its first answer teaches ---

    def lookup(self, hashes: Sequence[int], ttl_s: float, tenant_id: str, session_id: str | None) -> RouteView:
        previous = None
        if session_id is not None:
            row = self._conn.execute(
                "SELECT backend_id FROM sessions WHERE tenant_id = ? AND session_id = ? AND expires > ?",
                (tenant_id, session_id, time.time()),
            ).fetchone()
            previous = None if row is None else str(row[0])
        matched = self._match_prefix(hashes, ttl_s) if hashes else {}
        return RouteView(self.loads(), matched, previous)

    def started(self, backend_id: str, hashes: Sequence[int], ttl_s: float, max_entries: int,
                session: tuple[str, str, float] | None, moved: Inflight | None, lease_s: float) -> None:
        """Record the prefix there, pin the session (tenant, session, ttl_s) and move the counts, in one savepoint."""
        with self._write() as conn:
            if moved is not None:
                self._touch(conn, time.time(), lease_s)
                self._change_inflight(conn, moved, -1)
                self._change_inflight(conn, Inflight(backend_id, moved.prefill_tokens, moved.decode_tokens), 1)
            if hashes:
                self._record_prefix(conn, backend_id, hashes, ttl_s, max_entries)
            if session is not None:
                tenant_id, session_id, session_ttl_s = session
                conn.execute(
                    "INSERT INTO sessions VALUES (?, ?, ?, ?) ON CONFLICT (tenant_id, session_id)"
                    " DO UPDATE SET backend_id = excluded.backend_id, expires = excluded.expires",
                    (tenant_id, session_id, backend_id, time.time() + session_ttl_s),
                )

    # --- the ledger (the local store's `usage` table) ---

    def insert_usages(self, records: Sequence[UsageRecord], savings: Sequence[int]) -> list[bool]:
        """`Database.insert_usages` in this connection's (group) transaction."""
        with self._write() as conn:
            return write_usages(conn, records, savings)

    # --- prefix index ---

    def record_prefix(self, backend_id: str, hashes: Sequence[int], ttl_s: float, max_entries: int) -> None:
        """Note that `backend_id` holds these blocks; the leading ones become the most recently recorded."""
        with self._write() as conn:
            self._record_prefix(conn, backend_id, hashes, ttl_s, max_entries)

    @staticmethod
    def _record_prefix(conn: sqlite3.Connection, backend_id: str, hashes: Sequence[int], ttl_s: float,
                       max_entries: int) -> None:
        now = time.time()
        (seq,) = conn.execute("SELECT value FROM shared_counters WHERE name = 'prefix_seq'").fetchone()
        added = 0
        for h in reversed(hashes):  # last to first: the first block gets the highest sequence number
            seq += 1
            added += conn.execute("INSERT OR IGNORE INTO prefix_blocks VALUES (?, ?, ?)", (h, seq, now)).rowcount
            conn.execute("UPDATE prefix_blocks SET seq = ?, seen = ? WHERE hash = ?", (seq, now, h))
            conn.execute(
                "INSERT INTO prefix_holders VALUES (?, ?, ?) ON CONFLICT (hash, backend_id)"
                " DO UPDATE SET seen = excluded.seen",
                (h, backend_id, now),
            )
        conn.execute("UPDATE shared_counters SET value = ? WHERE name = 'prefix_seq'", (seq,))
        (count,) = conn.execute("SELECT value FROM shared_counters WHERE name = 'prefix_blocks'").fetchone()
        count += added
        count -= conn.execute("DELETE FROM prefix_blocks WHERE seen <= ?", (now - ttl_s,)).rowcount
        if count > max_entries:
            count -= conn.execute(
                "DELETE FROM prefix_blocks WHERE hash IN (SELECT hash FROM prefix_blocks ORDER BY seq LIMIT ?)",
                (count - max_entries,),
            ).rowcount
        conn.execute("UPDATE shared_counters SET value = ? WHERE name = 'prefix_blocks'", (count,))

    def remove_prefix(self, backend_id: str, hashes: Sequence[int]) -> None:
        with self._write() as conn:
            removed = 0
            for h in hashes:
                conn.execute("DELETE FROM prefix_holders WHERE hash = ? AND backend_id = ?", (h, backend_id))
                removed += conn.execute(
                    "DELETE FROM prefix_blocks WHERE hash = ? AND NOT EXISTS"
                    " (SELECT 1 FROM prefix_holders WHERE prefix_holders.hash = prefix_blocks.hash)",
                    (h,),
                ).rowcount
            conn.execute("UPDATE shared_counters SET value = value - ? WHERE name = 'prefix_blocks'", (removed,))

    def _match_prefix(self, hashes: Sequence[int], ttl_s: float) -> dict[str, int]:
        """For each backend, how many leading blocks of the chain it holds (seen within `ttl_s`)."""
        fresh_after = time.time() - ttl_s
        holders: dict[int, set[str]] = {}
        for start in range(0, len(hashes), _MAX_VARIABLES):
            chunk = hashes[start : start + _MAX_VARIABLES]
            rows = self._conn.execute(
                f"SELECT hash, backend_id FROM prefix_holders WHERE seen > ? AND hash IN ({','.join('?' * len(chunk))})",
                (fresh_after, *chunk),
            )
            for h, backend in rows:
                holders.setdefault(h, set()).add(backend)
            if any(h not in holders for h in chunk):
                break  # the leading run ends in this chunk
        return leading_runs(hashes, lambda h: holders.get(h, set()))
