"""The local store's shared mode: several gateway processes on one machine share the SQLite file
(`edgerun serve --workers N` without Redis, or several `edgerun serve` with `sqlite_shared = true`).

What the one-process store keeps in memory (rate-limit windows, request slots, in-flight tokens,
sessions, the prefix index) lives in the file's shared tables (shared_tables.py) next to the
budgets and the ledger; every check-and-change runs inside a `BEGIN IMMEDIATE` transaction (the
file's one write lock), so N workers never allow N x a limit. The calls that one wake-up of the
store's thread runs share that transaction (group commit, serial_worker.py), each in a savepoint:
one lock and one commit for many requests, and each caller is answered only after the commit. A
request's `admit`, `settle` (its ledger record included), `lookup` and `started` are one call each.

Every SQLite call runs on the store's one worker thread (never on the event loop); a worker
waiting for another process's write lock waits there, up to the busy timeout (then 503). Each
process's slots and in-flight tokens carry its lease (`inflight_lease_s`), renewed every third of
it by a task started on first use (`SharedLease`): a killed worker's counts stop counting within
the lease. Sessions are bounded by their TTL, and by `session_max_entries` at each renewal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from gateway.store.admission import Admitted, Claim, Inflight, Release, check_release_record
from gateway.store.checks import check_hashes, check_id, check_month, check_text, check_tokens
from gateway.store.lease import LeaseTask
from gateway.store.ledger import SavingsOf
from gateway.store.limits import ALLOWED, WINDOW_MS, limits_apply, refused, to_ms
from gateway.store.local.file import LocalFile
from gateway.store.local.shared_tables import SharedTables
from gateway.store.models import LimitDecision, UsageRecord
from gateway.store.routing import Loads, RouteKey, RouteView
from gateway.store.settings import StoreSettings

T = TypeVar("T")


class SharedLease:
    """This process's row in the shared tables: opened with the file, renewed while in use, dropped at close."""

    def __init__(self, file: LocalFile, settings: StoreSettings, replica: str) -> None:
        if settings.sqlite_path == ":memory:":
            raise ValueError("the shared mode needs a SQLite file, not ':memory:'")
        self.file = file
        self.settings = settings
        self.tables = SharedTables(settings.sqlite_path, replica, busy_timeout_s=settings.sqlite_busy_timeout_s,
                                   grouped=True)
        file.worker.commit = self.tables.commit  # one write transaction per run of shared-table calls
        self._task = LeaseTask("edgerun-sqlite-lease", self._renew)
        self._closing = False

    async def run(self, fn: Callable[..., T], *args: object) -> T:
        """A call on the shared tables: it joins the worker's group transaction (returns once committed)."""
        return await self.file.run(fn, *args, grouped=True)

    def start(self) -> None:
        self._task.start()

    async def _renew(self) -> None:
        s = self.settings
        while True:
            try:
                await self.run(self.tables.renew_lease, s.inflight_lease_s, s.session_max_entries)
            except Exception:  # noqa: BLE001 - the file is locked or gone for everyone: try again next period
                pass
            await asyncio.sleep(s.inflight_lease_s / 3)

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        await self._task.stop()
        try:  # our in-flight requests end with us
            await self.run(self.tables.drop_replica)
        except Exception:  # noqa: BLE001 - the lease drops them anyway
            pass
        await self.file.run(self.tables.close)


class SharedAdmission:
    admits_at_once = False  # decided on the worker thread, answered later

    def __init__(self, lease: SharedLease, savings: SavingsOf, clock: Callable[[], float] = time.time) -> None:
        self._lease = lease
        self._tables = lease.tables
        self._savings = savings
        self._clock = clock
        self._lease_s = lease.settings.inflight_lease_s

    def _now_ms(self, now: float | None) -> int:
        return to_ms(self._clock() if now is None else now)

    async def check_and_consume(
        self, key_id: str, rpm: int | None, tpm: int | None, tokens_estimate: int, now: float | None = None
    ) -> LimitDecision:
        if not limits_apply(key_id, rpm, tpm, tokens_estimate):
            return ALLOWED
        scopes = [(f"{key_id}:{which}", limit, cost)
                  for which, limit, cost in (("rpm", rpm, 1), ("tpm", tpm, tokens_estimate)) if limit is not None]
        retries = await self._lease.run(self._tables.check_and_consume, scopes, self._now_ms(now), WINDOW_MS)
        rpm_retry, tpm_retry = retries.get(f"{key_id}:rpm", 0), retries.get(f"{key_id}:tpm", 0)
        if rpm_retry == 0 and tpm_retry == 0:
            return ALLOWED
        return refused(rpm_retry or None, tpm_retry or None)

    async def admit(self, claim: Claim, now: float | None = None) -> Admitted:
        if claim.slot_limit is not None or claim.inflight is not None:
            self._lease.start()
        refusal, retry_ms, spent = await self._lease.run(
            self._tables.admit, claim, f"{claim.key_id}:tpm", self._now_ms(now), WINDOW_MS, self._lease_s
        )
        if refusal is None:
            return Admitted(True, spent_micro=spent)
        if refusal == "tpm":
            return Admitted(False, "tpm", retry_after_s=(retry_ms or 0) / 1000)
        return Admitted(False, "slot" if refusal == "slot" else "budget", spent_micro=spent)

    async def settle(self, release: Release, record: UsageRecord | None = None, now: float | None = None) -> bool | None:
        check_release_record(release, record)
        records = [] if record is None else [record]
        written = await self._lease.run(
            self._tables.settle, release, f"{release.key_id}:tpm", self._now_ms(now), WINDOW_MS, self._lease_s,
            records, [self._savings(r) for r in records],
        )
        return written[0] if written else None

    async def budget_spent(self, tenant_id: str, month: str) -> int:
        return await self._lease.run(self._tables.budget_spent, check_id("tenant id", tenant_id), check_month(month))


class SharedRouting:
    def __init__(self, lease: SharedLease) -> None:
        self._lease = lease
        self._tables = lease.tables
        self._settings = lease.settings

    async def lookup(self, key: RouteKey) -> RouteView:
        return await self._lease.run(
            self._tables.lookup, list(key.block_hashes), self._settings.prefix_index_ttl_s, key.tenant_id, key.session_id
        )

    async def started(self, backend_id: str, key: RouteKey, moved: Inflight | None = None) -> None:
        check_text("backend id", backend_id)
        hashes = list(dict.fromkeys(key.block_hashes))
        s = self._settings
        session = None if key.session_id is None else (key.tenant_id, key.session_id, s.session_ttl_s)
        if session is not None or moved is not None:
            self._lease.start()  # its renewals also drop expired sessions
        await self._lease.run(self._tables.started, backend_id, hashes, s.prefix_index_ttl_s,
                              s.prefix_index_max_entries, session, moved, s.inflight_lease_s)

    async def record_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        check_text("backend id", backend_id)
        hashes = list(dict.fromkeys(check_hashes(block_hashes)))
        if hashes:
            s = self._settings
            await self._lease.run(
                self._tables.record_prefix, backend_id, hashes, s.prefix_index_ttl_s, s.prefix_index_max_entries
            )

    async def remove_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        hashes = list(dict.fromkeys(check_hashes(block_hashes)))
        if hashes:
            await self._lease.run(self._tables.remove_prefix, backend_id, hashes)

    async def add_inflight(self, inflight: Inflight) -> None:
        await self._change(inflight, 1)

    async def release_inflight(self, inflight: Inflight) -> None:
        await self._change(inflight, -1)

    async def _change(self, inflight: Inflight, sign: int) -> None:
        self._lease.start()
        await self._lease.run(self._tables.change_inflight, inflight, sign, self._settings.inflight_lease_s)

    async def correct_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        check_tokens(backend_id, prefill_tokens, decode_tokens)
        self._lease.start()
        await self._lease.run(
            self._tables.correct_inflight, backend_id, prefill_tokens, decode_tokens, self._settings.inflight_lease_s
        )

    async def loads(self) -> Loads:
        return await self._lease.run(self._tables.loads)
