"""One serving process per SQLite file of the one-process local store, unless all share the file.

A process keeping the one-process local store keeps limits, request slots and budgets in its
memory. Two on one file (a lone `edgerun serve` beside `serve --workers N`, or two lone serves: all
on the default `sqlite_path`) would each grant every limit, and each writes the month's spend it
knows over the other's. So each holds an exclusive lock on `<sqlite_path>.host-lock` while it
serves (flock: the kernel drops it however the process ends, a SIGKILL included; the file keeps
the name it had when a store host held it), and the second is refused at start. Serves sharing the
file in its shared mode (`sqlite_shared`, every worker of `serve --workers N`: every limit is
checked in the file, under its write lock) hold the same lock shared: any number of them, but none
beside a process that keeps the store alone, whichever came first. Nothing else claims: serves on
Redis, and the CLI's own commands (`edgerun tenants|keys ...`), which open a running gateway's file
on purpose (what they write is taken in: local/tenancy.py).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class FileInUse(RuntimeError):
    """Another serve keeps this SQLite file's store."""


def claim(sqlite_path: str, holder: str, *, shared: bool = False) -> int | None:
    """Take the file for this process (`holder` says which it is, to the process refused next); the
    lock's descriptor, to keep open while serving, or None for a memory database (nobody else can
    reach it). FileInUse if taken. `shared`: alongside other shared claims only (the shared mode)."""
    if sqlite_path == ":memory:":
        return None
    # The file the store opens (`~` expanded, its directory made if new), by its real path: one
    # lock however the path is spelled, a symlink to the file included.
    path = Path(sqlite_path).expanduser().resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(f"{path}.host-lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        other = os.pread(fd, 4096, 0).decode(errors="replace") or "unknown"
        os.close(fd)
        raise FileInUse(
            f"another process serves {sqlite_path} ({other}): two would each grant every limit and "
            "overwrite each other's budgets; give this serve its own EDGERUN_SQLITE_PATH, or run every "
            "serve on the file with EDGERUN_SQLITE_SHARED=true (or on Redis)"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{holder}, pid {os.getpid()}".encode(), 0)
    return fd
