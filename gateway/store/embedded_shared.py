"""The embedded store shared by several gateway processes on one machine (`edgerun serve --workers N`).

What `EmbeddedStore` keeps in one process's memory (rate-limit windows, budgets, request slots,
in-flight tokens, sessions, the prefix index) lives here in the SQLite file instead, next to the
ledger, in the tables of `sqlite_shared.py`; every check-and-change runs inside a `BEGIN IMMEDIATE`
transaction (the file's one write lock), so N workers never allow N x a limit. The calls that one
wake-up of the store's thread runs share that transaction (group commit, serial_worker.py): one
lock and one commit for many requests, and each caller is answered only after the commit. Tenants
and keys stay cached in each process as in `EmbeddedStore`, but the catalog version is read on
every call (concurrent calls share one read), so a key created or revoked by one worker holds in
the others at once. The ledger is the same table, appended with `INSERT OR IGNORE` by request id
(in the same group transaction), so a record is written once whichever worker (or retry) appends
it, and counts as written once committed.

Chosen by `open_store` with `sqlite_shared = true` (several `edgerun serve` on one file; `serve
--workers N` shares a store host by default, cli/workers.py). The one-process `EmbeddedStore` stays
the default for a lone gateway: it decides limits in memory, without a transaction per request.

Every SQLite call runs on the store's one worker thread (never on the event loop); a worker
waiting for another process's write lock waits there, up to the busy timeout (then 503). Each
process's slots and in-flight tokens carry its lease (`inflight_lease_s`), renewed every third of
it by a task the store starts on first use: a killed worker's counts stop counting within the
lease. Sessions are bounded by their TTL, and by `session_max_entries` at each renewal.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from gateway.store.checks import (
    check_count,
    check_hashes,
    check_id,
    check_month,
    check_reservation,
    check_settlement,
    check_text,
    check_tokens,
)
from gateway.store.embedded import EmbeddedStore
from gateway.store.lease import LeaseTask
from gateway.store.limits import ALLOWED, WINDOW_MS, check_limit_args, refused, to_ms
from gateway.store.models import BudgetDecision, LimitDecision, Tenant, UsageRecord, copied
from gateway.store.redis_store import default_replica_id
from gateway.store.settings import StoreSettings
from gateway.store.sqlite_shared import SharedTables

T = TypeVar("T")


class SharedEmbeddedStore(EmbeddedStore):
    writes_on_loop = False  # every write joins the worker's group transaction on the shared file
    def __init__(self, settings: StoreSettings, clock: Callable[[], float] = time.time) -> None:
        """Open `settings.sqlite_path` (a file: several processes must reach it) and its shared tables."""
        if settings.sqlite_path == ":memory:":
            raise ValueError("a shared embedded store needs a SQLite file, not ':memory:'")
        super().__init__(settings, clock)
        # Another worker's new key or revocation must hold here at once, as it does with Redis: the
        # catalog version (one read) is checked on every call; callers meanwhile share that check.
        self._refresh_s = 0.0
        self._settings = settings
        replica = check_id("replica id", settings.replica_id or default_replica_id())
        self._shared = SharedTables(
            settings.sqlite_path, replica, busy_timeout_s=settings.sqlite_busy_timeout_s, grouped=True
        )
        self._worker.commit = self._shared.commit  # one write transaction per run of shared-table calls
        self._lease = LeaseTask("edgerun-sqlite-lease", self._renew_lease)
        self._closing = False

    async def _run_shared(self, fn: Callable[..., T], *args: object) -> T:
        """A call on the shared tables: it joins the worker's group transaction (returns once committed)."""
        return await self._run(fn, *args, grouped=True)

    # --- tenants: only ever added, never changed, so a cached one is current; a miss checks the file ---

    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        tenant = self._tenants.get(tenant_id)
        return copied(tenant) if tenant is not None else await super().get_tenant(tenant_id)

    async def get_tenant_by_account(self, account_id: str) -> Tenant | None:
        tenant_id = self._accounts.get(account_id)
        if tenant_id is not None:
            return copied(self._tenants[tenant_id])
        return await super().get_tenant_by_account(account_id)

    async def _renew_lease(self) -> None:
        s = self._settings
        while True:
            try:
                await self._run_shared(self._shared.renew_lease, s.inflight_lease_s, s.session_max_entries)
            except Exception:  # noqa: BLE001 - the file is locked or gone for everyone: try again next period
                pass
            await asyncio.sleep(s.inflight_lease_s / 3)

    # --- rate limits ---

    async def check_and_consume(
        self, key_id: str, rpm: int | None, tpm: int | None, tokens_estimate: int, now: float | None = None
    ) -> LimitDecision:
        check_limit_args(key_id, rpm, tpm, tokens_estimate)
        if rpm is None and tpm is None:
            return ALLOWED
        self._lease.start()
        scopes = [(f"{key_id}:{which}", limit, cost)
                  for which, limit, cost in (("rpm", rpm, 1), ("tpm", tpm, tokens_estimate)) if limit is not None]
        now_ms = to_ms(self._clock() if now is None else now)
        retries = await self._run_shared(self._shared.check_and_consume, scopes, now_ms, WINDOW_MS)
        rpm_retry, tpm_retry = retries.get(f"{key_id}:rpm", 0), retries.get(f"{key_id}:tpm", 0)
        if rpm_retry == 0 and tpm_retry == 0:
            return ALLOWED
        return refused(rpm_retry or None, tpm_retry or None)

    async def reconcile_tokens(self, key_id: str, estimate: int, actual: int, now: float | None = None) -> None:
        check_id("key id", key_id)
        check_count("estimate", estimate)
        check_count("actual", actual)
        if actual != estimate:
            now_ms = to_ms(self._clock() if now is None else now)
            await self._run_shared(self._shared.add_to_window, f"{key_id}:tpm", actual - estimate, now_ms, WINDOW_MS)

    # --- requests in flight per tenant ---

    async def acquire_request_slot(self, tenant_id: str, request_id: str, limit: int) -> bool:
        check_id("tenant id", tenant_id)
        check_text("request id", request_id)
        check_count("limit", limit, positive=True)
        self._lease.start()
        return await self._run_shared(
            self._shared.acquire_slot, tenant_id, request_id, limit, self._settings.inflight_lease_s
        )

    async def release_request_slot(self, tenant_id: str, request_id: str) -> None:
        check_id("tenant id", tenant_id)
        await self._run_shared(self._shared.release_slot, tenant_id, request_id)

    # --- budgets ---

    async def reserve_budget(
        self, tenant_id: str, month: str, amount_micro: int, budget_micro: int | None
    ) -> BudgetDecision:
        check_reservation(tenant_id, month, amount_micro, budget_micro)
        allowed, spent = await self._run_shared(self._shared.reserve_budget, tenant_id, month, amount_micro, budget_micro)
        return BudgetDecision(allowed=allowed, spent_micro=spent)

    async def settle_budget(self, tenant_id: str, month: str, reserved_micro: int, actual_micro: int) -> int:
        check_settlement(tenant_id, month, reserved_micro, actual_micro)
        return await self._run_shared(self._shared.settle_budget, tenant_id, month, actual_micro - reserved_micro)

    async def budget_spent(self, tenant_id: str, month: str) -> int:
        return await self._run_shared(self._shared.budget_spent, check_id("tenant id", tenant_id), check_month(month))

    # --- sessions ---

    async def get_session(self, tenant_id: str, session_id: str) -> str | None:
        check_id("tenant id", tenant_id)
        return await self._run_shared(self._shared.get_session, tenant_id, check_text("session id", session_id))

    async def set_session(self, tenant_id: str, session_id: str, backend_id: str) -> None:
        check_id("tenant id", tenant_id)
        check_text("session id", session_id)
        check_text("backend id", backend_id)
        self._lease.start()  # its renewals also drop expired sessions
        await self._run_shared(self._shared.set_session, tenant_id, session_id, backend_id, self._settings.session_ttl_s)

    async def delete_session(self, tenant_id: str, session_id: str) -> None:
        check_id("tenant id", tenant_id)
        await self._run_shared(self._shared.delete_session, tenant_id, check_text("session id", session_id))

    # --- prefix index ---

    async def record_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        check_text("backend id", backend_id)
        hashes = list(dict.fromkeys(check_hashes(block_hashes)))
        if hashes:
            s = self._settings
            await self._run_shared(
                self._shared.record_prefix, backend_id, hashes, s.prefix_index_ttl_s, s.prefix_index_max_entries
            )

    async def remove_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        hashes = list(dict.fromkeys(check_hashes(block_hashes)))
        if hashes:
            await self._run_shared(self._shared.remove_prefix, backend_id, hashes)

    async def match_prefix(self, block_hashes: Sequence[int]) -> dict[str, int]:
        hashes = check_hashes(block_hashes)
        if not hashes:
            return {}
        return await self._run_shared(self._shared.match_prefix, hashes, self._settings.prefix_index_ttl_s)

    # --- in-flight tokens ---

    async def add_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        await self._change_shared_inflight(backend_id, prefill_tokens, decode_tokens, sign=1)

    async def release_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        await self._change_shared_inflight(backend_id, prefill_tokens, decode_tokens, sign=-1)

    async def _change_shared_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int, sign: int) -> None:
        check_tokens(backend_id, prefill_tokens, decode_tokens)
        self._lease.start()
        await self._run_shared(
            self._shared.change_inflight, backend_id, sign * prefill_tokens, sign * decode_tokens,
            self._settings.inflight_lease_s,
        )

    async def correct_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        check_tokens(backend_id, prefill_tokens, decode_tokens)
        self._lease.start()
        await self._run_shared(
            self._shared.correct_inflight, backend_id, prefill_tokens, decode_tokens, self._settings.inflight_lease_s
        )

    async def loads(self) -> dict[str, tuple[int, int]]:
        return await self._run_shared(self._shared.loads)

    # --- ledger: appended in the group transaction, so a record counts as written once that commits ---

    async def _write_usages(self, records: list[UsageRecord]) -> list[bool]:
        return await self._run_shared(self._shared.insert_usages, records)

    # --- lifecycle ---

    async def aclose(self) -> None:
        if self._closing:
            return
        self._closing = True
        await self._lease.stop()
        try:  # our in-flight requests end with us
            await self._run_shared(self._shared.drop_replica)
        except Exception:  # noqa: BLE001 - the lease drops them anyway
            pass
        await self._run(self._shared.close)
        await super().aclose()
