"""The embedded store: one gateway process, no server. The default.

Tenants and keys are read from SQLite at start and kept in memory (written through on change),
so lookups never touch the disk. What another process commits to the file (`edgerun tenants|keys
...` without `--gateway`, on the file of a running gateway) is taken in on the first call at least
`sqlite_refresh_s` (0.5 s) after the last check: one read of the catalog version (which
triggers raise on every tenant or key written, whoever writes it) on the worker thread tells
whether anything changed; if so, tenants and keys are read again and merged (tenants and
keys are only ever added, and a revocation only ever set, so merging never undoes a change made
here meanwhile). A CLI revocation thus holds within that period plus one read. Limits, sessions, the prefix index and in-flight counters are
memory only: after a restart they start empty, which costs at most one minute of rate-limit
history and some cache affinity. Budgets and the ledger are SQLite rows.

Budget spends are decided in memory and written to the file with the next ledger transaction: a
request's reservation, and its settlement (which `Metering.settle` makes once its record is
written), go with whichever records are written next. A change that no record follows within
BUDGET_SAVE_S (quiet times, a request still running) is written on its own then; a write that
fails hands its spends back to the next (after failed saves the delay doubles, up to
BUDGET_RETRY_MAX_S, until a write goes through). So, while the file can be written, a crash loses
at most the reservations of the requests then in flight (which were never billed either) and
changes of the last BUDGET_SAVE_S; `aclose` writes everything. Under load (records every few ms)
this saves nearly two of a request's three commits; a lone request still costs two (its record,
then its settlement on its own), three if it runs longer than BUDGET_SAVE_S (its reservation is
then written on its own before its record).

SQLite work runs in call order on one worker thread owned by the store (serial_worker.py), with one
exception, the writes every request makes (its ledger record, with the budget spends, and budget
spends on their own): those run on the event loop itself when the worker has nothing queued or running, on a
second connection that never waits for a lock (`busy_timeout` 0) and never checkpoints. Such a
write (WAL, `synchronous=NORMAL`: the commit appends to the WAL and syncs nothing) takes tens of
microseconds; handing it to the thread cost several times that in GIL hand-offs between the two
threads (measured, BENCHMARKS.md "Gateway CPU per streamed request"). A write that finds the file
locked (another process writing), or fails for any other reason, goes to the worker instead, which
waits `sqlite_busy_timeout_s` or reports the error; so does any write while the worker is busy,
so writes never overtake each other. Every `CHECKPOINT_EVERY` such writes (on the loop or not), the
worker checkpoints the WAL (PASSIVE), which may sync the file: never on the loop; nor is the first
write after it, which starts the WAL over and syncs its header (so no connection of the store
checkpoints of itself). Memory updates
happen on the event loop without awaiting, which makes each check-and-change atomic. Ledger
appends are group-committed: records that arrive while a ledger transaction is being written go
into the next one together (one commit for many requests under load), and each `append_usage`
returns once its own record is committed, as before. A second process may read the same file
(the busy timeout makes it wait for the writer) but must not serve traffic from it: limits,
budgets and in-flight counts live in each process's memory, so two would allow twice the limits
(a store host and a lone `edgerun serve` claim the file while they serve, and refuse a second:
gateway/store/host/file_claim.py).
Several serving processes use `SharedEmbeddedStore` (embedded_shared.py) on the file instead.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, TypeVar

import structlog

from gateway.store import apikeys
from gateway.store.base import Store
from gateway.store.checks import (
    check_count,
    check_hashes,
    check_id,
    check_models,
    check_month,
    check_reservation,
    check_settlement,
    check_text,
    check_tokens,
)
from gateway.store.errors import Conflict, NotFound, StoreUnavailable
from gateway.store.limits import ALLOWED, WINDOW_MS, check_limit_args, refused, to_ms
from gateway.store.memory import PrefixTable, TtlMap, WindowCounters
from gateway.store.models import (
    ApiKey,
    BudgetDecision,
    LimitDecision,
    Tenant,
    UsageRecord,
    copied,
    new_tenant,
    to_us,
)
from gateway.store.serial_worker import SerialWorker
from gateway.store.settings import StoreSettings
from gateway.store.sqlite_db import USAGE_PAGE, Database
from policies.limits import WindowRule, sliding_window

T = TypeVar("T")
log = structlog.get_logger("edgerun.gateway.store")
BUDGET_SAVE_S = 0.05  # a budget change no ledger transaction took along is written this much later
BUDGET_RETRY_MAX_S = 5.0  # after failed saves the delay doubles up to this (a broken file: one warning each)
CHECKPOINT_EVERY = 256  # a request's writes between two WAL checkpoints on the worker (a few pages each)


class EmbeddedStore(Store):
    answers_in_memory = True  # sessions, prefixes and loads live in this process
    writes_on_loop = True  # a request's writes may run on the event loop (see the module's doc)

    def __init__(self, settings: StoreSettings, clock: Callable[[], float] = time.time) -> None:
        """Open (creating if needed) `settings.sqlite_path` and load tenants, keys and budgets.

        `clock` stamps created_at and revoked_at (tests may pass their own).
        """
        self._clock = clock
        on_loop = self.writes_on_loop and settings.sqlite_path != ":memory:"  # (a second connection: another database)
        # With writes on the loop, only the store checkpoints (`_write`): the worker's connection would
        # do it after a commit past 1000 WAL pages, and the WAL would then start over on the loop.
        self._db = Database(
            settings.sqlite_path, busy_timeout_s=settings.sqlite_busy_timeout_s, autocheckpoint=not on_loop
        )
        self._worker = SerialWorker("edgerun-sqlite")
        self._db_on_loop: Database | None = None
        if on_loop:
            self._db_on_loop = Database(
                settings.sqlite_path, busy_timeout_s=settings.sqlite_busy_timeout_s, autocheckpoint=False
            )
            self._db_on_loop.never_wait()
        self._writes = 0  # by `_write`, on the loop or the worker
        self._checkpointing: asyncio.Task[None] | None = None
        self._wal_may_restart = False  # until a write after the last checkpoint went through the worker
        self._tenants = {t.id: t for t in self._db.load_tenants()}
        self._accounts = {a: t.id for t in self._tenants.values() for a in t.account_ids}
        self._keys: dict[str, ApiKey] = {}
        self._key_hashes: dict[str, str] = {}  # key id -> hash
        self._key_by_hash: dict[str, str] = {}  # hash -> key id
        for key, key_hash in self._db.load_keys():
            self._remember_key(key, key_hash)
        self._budgets = self._db.load_budgets()
        self._windows = WindowCounters(WINDOW_MS)
        # TTLs here never leave the process, so they run on the monotonic clock (immune to NTP steps).
        self._sessions: TtlMap[tuple[str, str], str] = TtlMap(
            settings.session_max_entries, settings.session_ttl_s, time.monotonic
        )
        self._prefixes = PrefixTable(settings.prefix_index_max_entries, settings.prefix_index_ttl_s, time.monotonic)
        self._inflight: dict[str, list[int]] = {}  # backend -> [prefill, decode]
        self._slots: dict[str, set[str]] = {}  # tenant -> request ids in flight
        self._ledger_queue: list[tuple[UsageRecord, asyncio.Future[bool]]] = []
        self._ledger_writer: asyncio.Task[None] | None = None  # runs while the queue has records
        self._unsaved_budgets: set[tuple[str, str]] = set()  # spends changed in memory, not yet handed to a write
        self._budget_save: asyncio.TimerHandle | None = None  # starts `_save_budgets` BUDGET_SAVE_S after a change
        self._budget_saving: asyncio.Task[None] | None = None
        self._budget_save_delay_s = BUDGET_SAVE_S  # doubled after each failed save, reset by a good one
        self._refresh_s = settings.sqlite_refresh_s
        self._is_file = settings.sqlite_path != ":memory:"  # nobody else can write to a memory database
        self._catalog_version = self._db.catalog_version()
        self._checked_at = time.monotonic()
        self._refreshing: asyncio.Task[None] | None = None
        self._closed = False

    async def _may_refresh(self) -> None:
        """Take in tenants and keys another process committed, once the last check is
        `sqlite_refresh_s` old (callers meanwhile wait for the same check)."""
        if not self._is_file or time.monotonic() - self._checked_at < self._refresh_s:
            return
        if self._refreshing is None:
            self._refreshing = asyncio.create_task(self._refresh(), name="edgerun-sqlite-refresh")
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        started = time.monotonic()
        try:
            # Reads: they may run while the shared store's group transaction is open (WAL: never blocked).
            if await self._run(self._db.catalog_version, grouped=True) != self._catalog_version:
                version, tenants, keys = await self._run(self._db.load_tenants_and_keys, grouped=True)
                self._merge(tenants, keys)
                self._catalog_version = version
            self._checked_at = started
        finally:
            self._refreshing = None

    def _merge(self, tenants: list[Tenant], keys: list[tuple[ApiKey, str]]) -> None:
        for tenant in tenants:
            if tenant.id not in self._tenants:
                self._tenants[tenant.id] = tenant
                for account in tenant.account_ids:
                    self._accounts.setdefault(account, tenant.id)
        for key, key_hash in keys:
            known = self._keys.get(key.id)
            if known is None:
                self._remember_key(key, key_hash)
            elif known.revoked_at is None and key.revoked_at is not None:
                known.revoked_at = key.revoked_at

    async def _run(self, fn: Callable[..., T], *args: object, grouped: bool = False) -> T:
        """`fn(*args)` on the worker thread (`grouped`: `SerialWorker.run_grouped`); a file error is StoreUnavailable."""
        try:
            return await (self._worker.run_grouped if grouped else self._worker.run)(fn, *args)
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, disk full, file gone
            raise StoreUnavailable(f"the SQLite file cannot be written ({exc}); check EDGERUN_SQLITE_PATH") from exc

    async def _write(self, name: str, *args: object) -> Any:
        """`Database.<name>(*args)`: on the event loop when it can go at once (see the module's doc),
        else on the worker."""
        here = self._db_on_loop
        if here is None:
            return await self._run(getattr(self._db, name), *args)
        self._writes += 1
        if self._writes % CHECKPOINT_EVERY == 0 and self._checkpointing is None and not self._closed:
            self._wal_may_restart = True
            self._checkpointing = asyncio.get_running_loop().create_task(self._checkpoint())
        # After a complete checkpoint the next write starts the WAL over and syncs its header
        # (fdatasync, synchronous=NORMAL or not): that write goes to the worker too.
        if not self._wal_may_restart and self._worker.is_idle:
            try:
                return getattr(here, name)(*args)
            except sqlite3.Error:  # locked by another process, or a file error: the worker waits or reports it
                pass
        follows_checkpoint = self._wal_may_restart and self._checkpointing is None  # queued behind it
        result = await self._run(getattr(self._db, name), *args)
        if follows_checkpoint:
            self._wal_may_restart = False
        return result

    async def _checkpoint(self) -> None:
        try:
            await self._run(self._db.checkpoint)
        except (StoreUnavailable, sqlite3.Error) as exc:  # the next one tries again; the WAL only grows meanwhile
            log.warning("checkpointing the SQLite WAL failed", error=str(exc))
        finally:
            self._checkpointing = None

    # --- tenants ---

    async def create_tenant(
        self,
        name: str,
        account_ids: Sequence[str],
        *,
        allowed_models: Iterable[str] | None = None,
        monthly_budget_micro: int | None = None,
        tenant_id: str | None = None,
        max_concurrent_requests: int | None = None,
    ) -> Tenant:
        await self._may_refresh()
        tenant = new_tenant(
            name, account_ids, allowed_models, monthly_budget_micro, tenant_id, now=self._clock(),
            max_concurrent_requests=max_concurrent_requests,
        )
        if tenant.id in self._tenants:
            raise Conflict(f"tenant {tenant.id!r} already exists")
        for account in tenant.account_ids:
            if account in self._accounts:
                raise Conflict(f"account {account!r} is already owned by another tenant")
        # Claim in memory first (no await in between), then persist; undo if the write fails.
        self._tenants[tenant.id] = tenant
        self._accounts.update((a, tenant.id) for a in tenant.account_ids)
        try:
            await self._run(self._db.insert_tenant, tenant)
        except BaseException as exc:
            del self._tenants[tenant.id]
            for account in tenant.account_ids:
                del self._accounts[account]
            if isinstance(exc, sqlite3.IntegrityError):  # another process took the id or an account just now
                raise Conflict(f"tenant {tenant.id!r} or one of its accounts was just created elsewhere") from exc
            raise
        return copied(tenant)

    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        await self._may_refresh()
        tenant = self._tenants.get(tenant_id)
        return None if tenant is None else copied(tenant)

    async def get_tenant_by_account(self, account_id: str) -> Tenant | None:
        await self._may_refresh()
        tenant_id = self._accounts.get(account_id)
        return None if tenant_id is None else copied(self._tenants[tenant_id])

    async def list_tenants(self) -> list[Tenant]:
        await self._may_refresh()
        return sorted((copied(t) for t in self._tenants.values()), key=lambda t: (t.created_at, t.id))

    # --- API keys ---

    def _remember_key(self, key: ApiKey, key_hash: str) -> None:
        self._keys[key.id] = key
        self._key_hashes[key.id] = key_hash
        self._key_by_hash[key_hash] = key.id

    async def create_key(
        self,
        tenant_id: str,
        *,
        allowed_models: Iterable[str] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
    ) -> tuple[ApiKey, str]:
        await self._may_refresh()
        if tenant_id not in self._tenants:
            raise NotFound(f"tenant {tenant_id!r} does not exist")
        secret = apikeys.new_secret()
        key = ApiKey(
            id=apikeys.new_id("key"), tenant_id=tenant_id, prefix=apikeys.shown_prefix(secret),
            allowed_models=check_models(allowed_models), rpm=rpm, tpm=tpm, created_at=self._clock(),
        )
        key_hash = apikeys.hash_secret(secret)
        assert key_hash is not None
        await self._run(self._db.insert_key, key, key_hash)
        self._remember_key(key, key_hash)
        return copied(key), secret

    async def lookup_key(self, secret: str) -> ApiKey | None:
        await self._may_refresh()
        presented = apikeys.hash_secret(secret)
        if presented is None:
            return None
        key_id = self._key_by_hash.get(presented)
        if key_id is None or not apikeys.same_hash(self._key_hashes[key_id], presented):
            return None
        key = self._keys[key_id]
        return None if key.is_revoked else copied(key)

    async def get_key(self, key_id: str) -> ApiKey | None:
        await self._may_refresh()
        key = self._keys.get(key_id)
        return None if key is None else copied(key)

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        await self._may_refresh()
        keys = [copied(k) for k in self._keys.values() if k.tenant_id == tenant_id]
        return sorted(keys, key=lambda k: (k.created_at, k.id))

    async def revoke_key(self, key_id: str) -> bool:
        await self._may_refresh()
        key = self._keys.get(key_id)
        if key is None:
            return False
        if key.revoked_at is None:
            key.revoked_at = self._clock()  # effective at once; the row follows
            await self._run(self._db.revoke_key, key_id, key.revoked_at)
        return True

    # --- rate limits ---

    async def check_and_consume(
        self, key_id: str, rpm: int | None, tpm: int | None, tokens_estimate: int, now: float | None = None
    ) -> LimitDecision:
        check_limit_args(key_id, rpm, tpm, tokens_estimate)
        now_ms = to_ms(self._clock() if now is None else now)
        retry: dict[str, int | None] = {"rpm": None, "tpm": None}
        for which, limit, cost in (("rpm", rpm, 1), ("tpm", tpm, tokens_estimate)):
            if limit is not None:
                prev, current = self._windows.counts(f"{key_id}:{which}", now_ms)
                decision = sliding_window(prev, current, cost, WindowRule(limit, WINDOW_MS), now_ms)
                if not decision.allowed:
                    retry[which] = decision.retry_after_ms
        if retry["rpm"] is not None or retry["tpm"] is not None:
            return refused(retry["rpm"], retry["tpm"])
        if rpm is not None:
            self._windows.add(f"{key_id}:rpm", now_ms, 1)
        if tpm is not None:
            self._windows.add(f"{key_id}:tpm", now_ms, tokens_estimate)
        return ALLOWED

    async def reconcile_tokens(self, key_id: str, estimate: int, actual: int, now: float | None = None) -> None:
        check_id("key id", key_id)
        check_count("estimate", estimate)
        check_count("actual", actual)
        if actual != estimate:
            self._windows.add(f"{key_id}:tpm", to_ms(self._clock() if now is None else now), actual - estimate)

    # --- requests in flight per tenant (one process: no lease needed) ---

    async def acquire_request_slot(self, tenant_id: str, request_id: str, limit: int) -> bool:
        check_id("tenant id", tenant_id)
        check_text("request id", request_id)
        check_count("limit", limit, positive=True)
        held = self._slots.setdefault(tenant_id, set())
        if request_id not in held and len(held) >= limit:
            return False
        held.add(request_id)
        return True

    async def release_request_slot(self, tenant_id: str, request_id: str) -> None:
        held = self._slots.get(tenant_id)
        if held is not None:
            held.discard(request_id)
            if not held:
                del self._slots[tenant_id]

    # --- budgets ---

    async def reserve_budget(
        self, tenant_id: str, month: str, amount_micro: int, budget_micro: int | None
    ) -> BudgetDecision:
        check_reservation(tenant_id, month, amount_micro, budget_micro)
        spent = self._budgets.get((tenant_id, month), 0)
        if budget_micro is not None and spent + amount_micro > budget_micro:
            return BudgetDecision(allowed=False, spent_micro=spent)
        await self._save_budget(tenant_id, month, spent + amount_micro)
        return BudgetDecision(allowed=True, spent_micro=spent + amount_micro)

    async def settle_budget(self, tenant_id: str, month: str, reserved_micro: int, actual_micro: int) -> int:
        check_settlement(tenant_id, month, reserved_micro, actual_micro)
        spent = max(0, self._budgets.get((tenant_id, month), 0) + actual_micro - reserved_micro)
        await self._save_budget(tenant_id, month, spent)
        return spent

    async def _save_budget(self, tenant_id: str, month: str, spent: int) -> None:
        """Memory now; the file with the next ledger transaction, or within BUDGET_SAVE_S (module doc)."""
        if spent >= 2**63:  # SQLite's INTEGER: refused here, as SQLite itself refused it when saves were
            # immediate; written later, it would fail every ledger transaction that carried it
            raise OverflowError(f"a month's spend of {spent} micro-units does not fit in 64 bits")
        key = (tenant_id, month)
        self._budgets[key] = spent
        self._unsaved_budgets.add(key)
        self._arm_budget_save()

    def _arm_budget_save(self) -> None:
        if self._budget_save is None and not self._closed:
            self._budget_save = asyncio.get_running_loop().call_later(self._budget_save_delay_s, self._start_budget_save)

    def _start_budget_save(self) -> None:
        self._budget_save = None
        if self._unsaved_budgets and self._budget_saving is None:
            self._budget_saving = asyncio.get_running_loop().create_task(self._save_budgets())

    def _take_unsaved_budgets(self) -> dict[tuple[str, str], int]:
        """The spends changed since they were last handed to a write, as memory holds them now.
        A write that fails hands them back (`_give_back_budgets`): each later write takes memory's
        value again, and writes commit in the order they are made, so an older spend never
        overwrites a newer one."""
        taken = {key: self._budgets[key] for key in self._unsaved_budgets}
        self._unsaved_budgets = set()
        return taken

    def _give_back_budgets(self, taken: dict[tuple[str, str], int]) -> None:
        self._unsaved_budgets.update(taken)
        self._arm_budget_save()

    def _budget_writes_work(self) -> None:
        """A write to the file went through (a save, or a ledger transaction): after failed saves, the
        delay is BUDGET_SAVE_S again, and a timer armed with the longer one is armed anew."""
        if self._budget_save_delay_s == BUDGET_SAVE_S:
            return
        self._budget_save_delay_s = BUDGET_SAVE_S
        if self._budget_save is not None:
            self._budget_save.cancel()
            self._budget_save = None
            if self._unsaved_budgets:
                self._arm_budget_save()

    async def _save_budgets(self) -> None:
        """Write what no ledger transaction took along (quiet times: no record followed the change)."""
        try:
            await self._write_unsaved_budgets()
        except Exception as exc:  # the file is locked past the busy timeout, full or gone: try again later
            self._budget_save_delay_s = min(2 * self._budget_save_delay_s, BUDGET_RETRY_MAX_S)
            log.warning("saving budget spends failed", error=str(exc), retry_in_s=self._budget_save_delay_s)
        finally:
            self._budget_saving = None
            if self._unsaved_budgets:  # handed back, or changed meanwhile (their timer found this save running)
                self._arm_budget_save()

    async def flush(self) -> None:
        """Write every budget spend still only in memory now (StoreUnavailable if the file cannot be written)."""
        if self._budget_saving is not None:
            await asyncio.wait({self._budget_saving})
        try:
            await self._write_unsaved_budgets()
        finally:
            if self._unsaved_budgets:
                self._arm_budget_save()

    async def _write_unsaved_budgets(self) -> None:
        """One transaction of the spends not yet written (none if a ledger write took them); a failure
        hands them back to the next write and raises."""
        taken = self._take_unsaved_budgets()
        if not taken:
            return
        try:
            await self._write("save_budgets", taken)
        except BaseException:
            self._unsaved_budgets.update(taken)
            raise
        self._budget_writes_work()

    async def budget_spent(self, tenant_id: str, month: str) -> int:
        return self._budgets.get((tenant_id, check_month(month)), 0)

    # --- sessions ---

    async def get_session(self, tenant_id: str, session_id: str) -> str | None:
        return self._sessions.get(_session_key(tenant_id, session_id))

    async def set_session(self, tenant_id: str, session_id: str, backend_id: str) -> None:
        self._sessions.set(_session_key(tenant_id, session_id), check_text("backend id", backend_id))

    async def delete_session(self, tenant_id: str, session_id: str) -> None:
        self._sessions.delete(_session_key(tenant_id, session_id))

    # --- prefix index ---

    async def record_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        self._prefixes.record(check_text("backend id", backend_id), check_hashes(block_hashes))

    async def remove_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        self._prefixes.remove(backend_id, check_hashes(block_hashes))

    async def match_prefix(self, block_hashes: Sequence[int]) -> dict[str, int]:
        return self._prefixes.match(check_hashes(block_hashes))

    # --- in-flight tokens (this process is the only replica: no lease needed) ---

    async def add_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        self._change_inflight(backend_id, prefill_tokens, decode_tokens, sign=1)

    async def release_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        self._change_inflight(backend_id, prefill_tokens, decode_tokens, sign=-1)

    def _change_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int, sign: int) -> None:
        check_tokens(backend_id, prefill_tokens, decode_tokens)
        counts = self._inflight.setdefault(backend_id, [0, 0])
        counts[0] = max(0, counts[0] + sign * prefill_tokens)
        counts[1] = max(0, counts[1] + sign * decode_tokens)
        if counts == [0, 0]:
            del self._inflight[backend_id]

    async def correct_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        self._inflight.pop(backend_id, None)
        self._change_inflight(backend_id, prefill_tokens, decode_tokens, sign=1)

    async def loads(self) -> dict[str, tuple[int, int]]:
        return {b: (p, d) for b, (p, d) in self._inflight.items()}

    # --- server-side secrets ---

    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        return await self._run(self._db.get_or_create_secret, check_id("secret name", name), candidate)

    # --- ledger ---

    async def append_usage(self, record: UsageRecord) -> bool:
        if not isinstance(record, UsageRecord):
            raise TypeError(f"append_usage takes a UsageRecord, got {type(record).__name__}")
        written: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._ledger_queue.append((record, written))
        if self._ledger_writer is None:
            self._ledger_writer = asyncio.create_task(self._write_ledger(), name="edgerun-ledger-writer")
        return await written  # a cancelled caller's record is still written

    async def _write_ledger(self) -> None:
        """Commit queued records, one transaction per batch, until the queue is empty."""
        batch: list[tuple[UsageRecord, asyncio.Future[bool]]] = []
        try:
            while self._ledger_queue:
                batch, self._ledger_queue = self._ledger_queue, []
                outcomes = await self._insert_usages([record for record, _ in batch])
                for (_, written), outcome in zip(batch, outcomes):
                    if written.done():
                        continue
                    if isinstance(outcome, BaseException):
                        written.set_exception(outcome)
                    else:
                        written.set_result(outcome)
        except asyncio.CancelledError:  # the loop is going away: nothing is known to be committed
            for _, written in [*batch, *self._ledger_queue]:
                if not written.done():
                    written.set_exception(StoreUnavailable("the ledger writer was stopped"))
            self._ledger_queue = []
            raise
        finally:
            self._ledger_writer = None

    async def _write_usages(self, records: list[UsageRecord]) -> list[bool]:
        """One transaction of ledger records, and of the budget spends not yet written (the shared
        store writes records in its group transaction, and its budgets are never only in memory)."""
        budgets = self._take_unsaved_budgets()
        try:
            written: list[bool] = await self._write("insert_usages", records, budgets)
        except BaseException:
            self._give_back_budgets(budgets)
            raise
        self._budget_writes_work()
        return written

    async def _insert_usages(self, records: list[UsageRecord]) -> list[bool | BaseException]:
        """Each record's outcome. A batch that fails for any other reason than the file (which
        fails them all alike) is written again one record at a time, so one bad record fails alone."""
        try:
            return list(await self._write_usages(records))
        except StoreUnavailable as exc:
            return [exc] * len(records)
        except Exception as exc:
            if len(records) == 1:
                return [exc]
        outcomes: list[bool | BaseException] = []
        for record in records:
            outcomes.extend(await self._insert_usages([record]))
        return outcomes

    async def iter_usage(self, start: float, end: float, tenant_id: str | None = None) -> AsyncIterator[UsageRecord]:
        if tenant_id is not None:
            check_id("tenant id", tenant_id)
        async for record in self._db.iter_usage(self._run, to_us(start), to_us(end), tenant_id):
            yield record

    async def usage_page(
        self, start_us: int, end_us: int, tenant_id: str | None, after: tuple[int, str] | None
    ) -> list[UsageRecord]:
        """One page of `iter_usage` (up to `USAGE_PAGE` records of [start_us, end_us) after the
        (ended_us, request_id) `after`), for a reader in another process: the store host's workers."""
        if tenant_id is not None:
            check_id("tenant id", tenant_id)
        return await self._run(self._db.usage_page, start_us, end_us, tenant_id, after, USAGE_PAGE)

    async def get_usage(self, request_id: str) -> UsageRecord | None:
        return await self._run(self._db.get_usage, request_id)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._refreshing is not None:
            await asyncio.wait({self._refreshing})
        if self._ledger_writer is not None:  # what was queued is committed before the file closes
            await asyncio.wait({self._ledger_writer})
        if self._budget_save is not None:
            self._budget_save.cancel()
        try:
            await self.flush()
        except Exception as exc:  # nothing more can be done: the ledger holds what was billed
            log.error("budget spends could not be written at close", error=str(exc))
        if self._checkpointing is not None:
            await asyncio.wait({self._checkpointing})
        if self._db_on_loop is not None:
            self._db_on_loop.close()
        await self._run(self._db.close)
        self._worker.close()


def _session_key(tenant_id: str, session_id: str) -> tuple[str, str]:
    return check_id("tenant id", tenant_id), check_text("session id", session_id)


