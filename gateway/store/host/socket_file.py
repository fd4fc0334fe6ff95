"""The host's Unix socket file: private to its user, one live host per path.

The socket is created 0600 inside a directory that is either created here 0700 or already owned
by this user and writable by nobody else (so no one else can swap the socket for theirs). A file
left by a host that died is replaced; a path where a host still answers is refused. A worker, for
its part, checks that the process it reached runs as its own user (`peer_uid`) before it sends
anything (API keys among it): a path in a directory others can write to may be served by anyone.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from pathlib import Path


class SocketInUse(RuntimeError):
    """Another store host answers on the path, or the path is not a socket this host may replace."""


def bind_private(path: str) -> tuple[socket.socket, int]:
    """A listening socket bound at `path` (mode 0600) and its file's inode (see `remove`)."""
    place = Path(path)
    _private_directory(place.parent)
    if place.exists() or place.is_symlink():
        _replace_stale(place)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old_umask = os.umask(0o177)  # the file is born 0600: no moment when others could connect
        try:
            sock.bind(path)
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        sock.listen(128)
        sock.setblocking(False)
        return sock, os.stat(path).st_ino
    except BaseException:
        sock.close()
        raise


def remove(path: str, inode: int) -> None:
    """Delete the socket file if it is still the one this host bound (not a successor's)."""
    try:
        if os.stat(path).st_ino == inode:
            os.unlink(path)
    except FileNotFoundError:
        pass


def peer_uid(sock: socket.socket) -> int | None:
    """The user id of the process at the other end of a connected Unix socket (Linux's
    SO_PEERCRED); None where the system does not tell."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i")))
    return int(uid)


def _private_directory(directory: Path) -> None:
    if not directory.exists():
        directory.mkdir(mode=0o700, parents=True)
        return
    info = directory.stat()
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SocketInUse(
            f"{directory} is not private to this user (owner uid {info.st_uid}, mode {oct(info.st_mode & 0o777)}): "
            "put the store socket in a directory only you can write to (e.g. chmod 700 it)"
        )


def _replace_stale(place: Path) -> None:
    if not stat.S_ISSOCK(place.lstat().st_mode):
        raise SocketInUse(f"{place} exists and is not a socket: refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(place))
    except ConnectionRefusedError:  # nobody listens: a host that died left it
        place.unlink()
        return
    finally:
        probe.close()
    raise SocketInUse(f"a store host is already serving on {place}: stop it first")
