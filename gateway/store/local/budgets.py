"""`BudgetBook`: the one-process store's monthly spends, decided in memory and saved to the SQLite file.

A request's reservation, and its settlement, go to the file with whichever ledger transaction is
written next (`LocalLedger` takes them along: `take_unsaved`). A change that no record follows
within BUDGET_SAVE_S (quiet times, a request still running) is written on its own then; a write
that fails hands its spends back to the next (after failed saves the delay doubles, up to
BUDGET_RETRY_MAX_S, until a write goes through). So, while the file can be written, a crash loses at
most the reservations of the requests then in flight (which were never billed either) and changes
of the last BUDGET_SAVE_S; `aclose` writes everything. Under load (records every few ms) this
saves nearly two of a request's three commits.
"""

from __future__ import annotations

import asyncio

import structlog

from gateway.store.local.file import LocalFile

log = structlog.get_logger("edgerun.gateway.store")
BUDGET_SAVE_S = 0.05  # a budget change no ledger transaction took along is written this much later
BUDGET_RETRY_MAX_S = 5.0  # after failed saves the delay doubles up to this (a broken file: one warning each)
_INT64_LIMIT = 2**63


class BudgetBook:
    def __init__(self, file: LocalFile) -> None:
        self._file = file
        self._spent = file.db.load_budgets()  # (tenant id, month) -> micro-units
        self._unsaved: set[tuple[str, str]] = set()  # spends changed in memory, not yet handed to a write
        self._save: asyncio.TimerHandle | None = None  # starts `_save_unsaved` save_delay_s after a change
        self._saving: asyncio.Task[None] | None = None
        self.save_delay_s = BUDGET_SAVE_S  # doubled after each failed save, reset by a good one
        self._closed = False

    def spent(self, tenant_id: str, month: str) -> int:
        return self._spent.get((tenant_id, month), 0)

    def set(self, tenant_id: str, month: str, spent: int) -> None:
        """Memory now; the file with the next ledger transaction, or within the save delay."""
        if spent >= _INT64_LIMIT:  # SQLite's INTEGER: refused here, as SQLite itself refused it when saves were
            # immediate; written later, it would fail every ledger transaction that carried it
            raise OverflowError(f"a month's spend of {spent} micro-units does not fit in 64 bits")
        key = (tenant_id, month)
        self._spent[key] = spent
        self._unsaved.add(key)
        self._arm()

    def _arm(self) -> None:
        if self._save is None and not self._closed:
            self._save = asyncio.get_running_loop().call_later(self.save_delay_s, self._start_save)

    def _start_save(self) -> None:
        self._save = None
        if self._unsaved and self._saving is None:
            self._saving = asyncio.get_running_loop().create_task(self._save_unsaved())

    def take_unsaved(self) -> dict[tuple[str, str], int]:
        """The spends changed since they were last handed to a write, as memory holds them now.
        A write that fails hands them back (`give_back`): each later write takes memory's value
        again, and writes commit in the order they are made, so an older spend never overwrites a
        newer one."""
        taken = {key: self._spent[key] for key in self._unsaved}
        self._unsaved = set()
        return taken

    def give_back(self, taken: dict[tuple[str, str], int]) -> None:
        self._unsaved.update(taken)
        self._arm()

    def writes_work(self) -> None:
        """A write to the file went through (a save, or a ledger transaction): after failed saves, the
        delay is BUDGET_SAVE_S again, and a timer armed with the longer one is armed anew."""
        if self.save_delay_s == BUDGET_SAVE_S:
            return
        self.save_delay_s = BUDGET_SAVE_S
        if self._save is not None:
            self._save.cancel()
            self._save = None
            if self._unsaved:
                self._arm()

    async def _save_unsaved(self) -> None:
        """Write what no ledger transaction took along (quiet times: no record followed the change)."""
        try:
            await self._write_unsaved()
        except Exception as exc:  # the file is locked past the busy timeout, full or gone: try again later
            self.save_delay_s = min(2 * self.save_delay_s, BUDGET_RETRY_MAX_S)
            log.warning("saving budget spends failed", error=str(exc), retry_in_s=self.save_delay_s)
        finally:
            self._saving = None
            if self._unsaved:  # handed back, or changed meanwhile (their timer found this save running)
                self._arm()

    async def flush(self) -> None:
        """Write every spend still only in memory now (StoreUnavailable if the file cannot be written)."""
        if self._saving is not None:
            await asyncio.wait({self._saving})
        try:
            await self._write_unsaved()
        finally:
            if self._unsaved:
                self._arm()

    async def _write_unsaved(self) -> None:
        """One transaction of the spends not yet written (none if a ledger write took them); a failure
        hands them back to the next write and raises."""
        taken = self.take_unsaved()
        if not taken:
            return
        try:
            await self._file.write("save_budgets", taken)
        except BaseException:
            self._unsaved.update(taken)
            raise
        self.writes_work()

    async def aclose(self) -> None:
        """Write everything (a failure is logged: the ledger holds what was billed)."""
        self._closed = True
        if self._save is not None:
            self._save.cancel()
        try:
            await self.flush()
        except Exception as exc:  # nothing more can be done: the ledger holds what was billed
            log.error("budget spends could not be written at close", error=str(exc))
