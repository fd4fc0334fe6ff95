"""The ledger spool: usage records the ledger could not take (Redis down), kept on local disk.

`LedgerSpool.append` adds one JSON line to `PATH` (open, write, fsync, close, under an exclusive
`flock` on `PATH.lock`). `replay(ledger)` moves them into the ledger:

1. leftovers first: each `PATH.replay-*` file (a replay that stopped or crashed) is replayed;
2. then, under the lock, `PATH` is renamed to a fresh `PATH.replay-<ns>-<pid>`: appenders open
   `PATH` by name under the same lock, so none writes into a file being replayed;
3. each record of that file is appended to the ledger; only when every line is in does the file
   get deleted (and the directory fsynced).

Crash-safe because the ledger is idempotent by request id: a crash anywhere leaves at worst a
file whose records are partly in the ledger already, and replaying it again writes only the
rest. A store error stops the replay and leaves the file for the next try. Several processes
may share one spool (same host, same store): both may replay one file, the ledger keeps one
copy of each record. A line that cannot be a record (a crash cut it) goes to `PATH.corrupt`.

`replay_forever` is the background task (owned by the app's lifespan): it replays at once at
start-up, then every `interval_s` while anything is pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog

from gateway.billing.settings import BillingSettings
from gateway.store.errors import InvalidArgument
from gateway.store.ledger import Ledger
from gateway.store.models import UsageRecord
from gateway.store.settings import StoreSettings

log = structlog.get_logger("edgerun.gateway.billing.spool")


def spool_path(billing: BillingSettings, store: StoreSettings) -> Path | None:
    """`billing.ledger_spool_path`, else a file named after the store it belongs to (records must
    be replayed into the ledger they were meant for): next to the SQLite file for the embedded
    store, or `ledger-spool-<hash of URL and key prefix>.jsonl` in the same folder for Redis.
    None for an in-memory SQLite store (its ledger does not outlive the process either)."""
    if billing.ledger_spool_path:
        return Path(billing.ledger_spool_path)
    memory = store.sqlite_path == ":memory:"
    folder = Path(tempfile.gettempdir()) if memory else Path(store.sqlite_path).parent
    if store.redis_url:
        digest = hashlib.sha256(f"{store.redis_url}\0{store.key_prefix}".encode()).hexdigest()[:16]
        return folder / f"ledger-spool-{digest}.jsonl"
    return None if memory else Path(store.sqlite_path + ".spool.jsonl")


@dataclass(slots=True)
class ReplayResult:
    written: int = 0  # records the ledger did not have yet
    duplicates: int = 0  # records it had already (an earlier replay, or a write that did land)
    corrupt: int = 0  # lines moved to PATH.corrupt
    complete: bool = False  # False: the store failed midway; the rest stays spooled


class LedgerSpool:
    def __init__(self, path: Path) -> None:
        """A spool at `path` (its folder is created on first use)."""
        self.path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self._corrupt_path = path.with_name(path.name + ".corrupt")
        self._replay_lock = asyncio.Lock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing drops the lock

    def append(self, record: UsageRecord) -> None:
        """Add one record durably (fsynced before returning). Blocking: call it in a thread."""
        line = (record.to_json() + "\n").encode()
        with self._locked():
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":  # a crash cut the last line short
                    line = b"\n" + line
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(self.path.parent)

    def pending_files(self) -> list[Path]:
        """Files with records waiting: leftovers of earlier replays (oldest first), then the live spool."""
        rotated = sorted(self.path.parent.glob(self.path.name + ".replay-*"))
        live = [self.path] if self.path.exists() and self.path.stat().st_size > 0 else []
        return rotated + live

    def pending(self) -> bool:
        return bool(self.pending_files())

    def _rotate(self) -> Path | None:
        with self._locked():
            if not self.path.exists() or self.path.stat().st_size == 0:
                return None
            rotated = self.path.with_name(f"{self.path.name}.replay-{time.time_ns():020d}-{os.getpid()}")
            os.rename(self.path, rotated)
        _fsync_dir(self.path.parent)
        return rotated

    async def replay(self, ledger: Ledger) -> ReplayResult:
        """Append every spooled record to `ledger`; see the module docstring."""
        result = ReplayResult()
        async with self._replay_lock:
            for path in sorted(self.path.parent.glob(self.path.name + ".replay-*")):
                if not await self._replay_file(path, ledger, result):
                    return result
            rotated = await asyncio.to_thread(self._rotate)
            if rotated is not None and not await self._replay_file(rotated, ledger, result):
                return result
        result.complete = True
        return result

    async def _replay_file(self, path: Path, ledger: Ledger, result: ReplayResult) -> bool:
        try:
            f = open(path, "rb")  # read line by line: an outage's spool may be large
        except FileNotFoundError:
            return True  # another process finished it
        with f:
            if not await self._replay_lines(f, path, ledger, result):
                return False
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        _fsync_dir(path.parent)
        return True

    async def _replay_lines(self, lines: Iterable[bytes], path: Path, ledger: Ledger, result: ReplayResult) -> bool:
        for line in lines:
            line = line.rstrip(b"\n")
            if not line.strip():
                continue
            try:
                record = UsageRecord.from_json(line.decode())
            except (ValueError, TypeError, InvalidArgument):
                await asyncio.to_thread(self._keep_corrupt, line)
                result.corrupt += 1
                continue
            try:
                written = await ledger.append(record)
            except Exception as exc:  # the store is still down: keep the file for the next try
                log.warning("ledger replay stopped", file=str(path), error=str(exc))
                return False
            if written:
                result.written += 1
            else:
                result.duplicates += 1
        return True

    def _keep_corrupt(self, line: bytes) -> None:
        log.error("a spooled line is not a usage record; kept aside", file=str(self._corrupt_path))
        with open(self._corrupt_path, "ab") as f:
            f.write(line + b"\n")
            f.flush()
            os.fsync(f.fileno())


async def replay_forever(spool: LedgerSpool, ledger: Ledger, interval_s: float) -> None:
    """Replay now (start-up), then every `interval_s` while records are pending; runs until cancelled."""
    while True:
        if await asyncio.to_thread(spool.pending):
            try:
                result = await spool.replay(ledger)
            except Exception:
                log.exception("ledger replay failed")
            else:
                if result.written or result.duplicates or result.corrupt:
                    log.info(
                        "spooled usage records replayed",
                        written=result.written,
                        duplicates=result.duplicates,
                        corrupt=result.corrupt,
                        complete=result.complete,
                    )
        await asyncio.sleep(interval_s)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
