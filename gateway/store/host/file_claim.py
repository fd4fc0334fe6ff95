"""One store host per SQLite file.

Two hosts on one file (say two `edgerun serve --workers N` on different ports, both on the default
`sqlite_path`: each gets a socket of its own) would each keep limits, request slots and budgets in
its memory: every limit would be granted twice, and each host writes the month's spend it knows
over the other's. So a host holds an exclusive lock on `<sqlite_path>.host-lock` while it serves
(flock: the kernel drops it however the process ends, a SIGKILL included), and a second host on the
file is refused at start. Several serves share one file through `sqlite_shared = true` or Redis.
"""

from __future__ import annotations

import fcntl
import os


class FileInUse(RuntimeError):
    """Another store host serves this SQLite file."""


def claim(sqlite_path: str, socket_path: str) -> int | None:
    """Take the file for this host (served on `socket_path`); the lock's descriptor, to keep open
    while serving, or None for a memory database (nobody else can reach it). FileInUse if taken."""
    if sqlite_path == ":memory:":
        return None
    fd = os.open(f"{sqlite_path}.host-lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 4096, 0).decode(errors="replace") or "unknown"
        os.close(fd)
        raise FileInUse(
            f"another store host serves {sqlite_path} (on {holder}): two would each grant every limit "
            "and overwrite each other's budgets; give this serve its own EDGERUN_SQLITE_PATH, or share "
            "one file between serves with EDGERUN_SQLITE_SHARED=true or Redis"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, socket_path.encode(), 0)
    return fd
