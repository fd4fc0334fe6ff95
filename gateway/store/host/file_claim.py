"""One serving process per SQLite file of the one-process store: a store host, or a lone `edgerun serve`.

A process keeping the one-process `EmbeddedStore` keeps limits, request slots and budgets in its
memory. Two on one file (two `serve --workers N` on different ports, each with its host; a lone
`edgerun serve` beside one of those; two lone serves: all on the default `sqlite_path`) would each
grant every limit, and each writes the month's spend it knows over the other's. So each holds an
exclusive lock on `<sqlite_path>.host-lock` while it serves (flock: the kernel drops it however the
process ends, a SIGKILL included), and the second is refused at start. Serves sharing the file in
its shared mode (`sqlite_shared`: every limit is checked in the file, under its write lock) hold the
same lock shared: any number of them, but none beside a process that keeps the store alone, whichever
came first. Nothing else claims: a host's workers (`HostedStore`), serves on Redis, and the CLI's own
commands (`edgerun tenants|keys ...`), which open a running gateway's file on purpose (what they
write is taken in: EmbeddedStore's docstring).
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class FileInUse(RuntimeError):
    """Another store host or lone serve serves this SQLite file."""


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
