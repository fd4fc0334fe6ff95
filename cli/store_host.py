"""The store host process of one `edgerun serve --workers N` (cli/workers.py runs it).

Without Redis the workers share one store host (`python -m gateway.store.host --socket PATH`): one
process owning the embedded store, reached over a Unix socket (gateway/store/host). The socket
lives in a directory made for this serve alone (`tempfile.mkdtemp`: mode 0700, a fresh name under
`$XDG_RUNTIME_DIR`, else the temporary directory), so two serves never share one, and the
directory goes when the serve ends. The workers find the socket in `EDGERUN_STORE_SOCKET`.

The host runs in its own process group: a Ctrl-C in the terminal reaches the supervisor and the
workers, not the host, which the supervisor stops only after the workers have settled their
requests' ledger records through it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cli.parent_death import stop_with_parent
from gateway.store.host.process import wait_served
from gateway.store.settings import StoreSettings

STORE_SOCKET_ENV = "EDGERUN_STORE_SOCKET"
SOCKET_NAME = "store.sock"


def needs_store_host(store: StoreSettings) -> bool:
    """Whether `serve --workers N` starts a host: not when the workers share Redis, a host run
    elsewhere (`store_socket`), or the SQLite file by choice (`sqlite_shared = true`)."""
    return store.redis_url is None and store.store_socket is None and not store.sqlite_shared


def private_directory(port: int) -> Path:
    """A new directory only this user can enter, named after the serve's port (and a random tail)."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR")  # per user, in memory, emptied at logout
    if runtime_dir:
        try:
            return Path(tempfile.mkdtemp(prefix=f"edgerun-{port}-", dir=runtime_dir))
        except OSError:  # named but missing or not writable (a container, `su`): the temporary directory
            pass
    return Path(tempfile.mkdtemp(prefix=f"edgerun-{port}-"))


@dataclass
class StoreHost:
    """The host's command line, its socket, and the process while it runs."""

    directory: Path
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def create(cls, port: int) -> StoreHost:
        """A host for the serve on `port`, in a new private directory (not started)."""
        directory = private_directory(port)
        argv = [sys.executable, "-m", "gateway.store.host", "--socket", str(directory / SOCKET_NAME)]
        return cls(directory, argv)

    @property
    def socket_path(self) -> Path:
        return self.directory / SOCKET_NAME

    @property
    def env(self) -> dict[str, str]:
        """What a worker's environment adds to reach this host."""
        return {STORE_SOCKET_ENV: str(self.socket_path)}

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv, process_group=0, preexec_fn=stop_with_parent())
        self.started = time.monotonic()

    def poll(self) -> int | None:
        """The exit status once the process is gone; None while it runs (or before it started)."""
        return None if self.process is None else self.process.poll()

    def wait_ready(self, timeout_s: float, give_up: Callable[[], bool] = lambda: False) -> None:
        """Until the socket accepts a connection; HostNotReady if the host exits first or time runs out.
        Returns early, not ready, once `give_up()` is true (a SIGTERM meanwhile)."""
        assert self.process is not None
        wait_served(self.process, str(self.socket_path), timeout_s, give_up)

    def stop(self, timeout_s: float) -> bool:
        """SIGTERM (the host drains and closes the store), SIGKILL after `timeout_s`; False if it was killed."""
        if self.process is None or self.process.poll() is not None:
            return True
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            return False

    def remove(self) -> None:
        """The private directory and whatever the host left in it."""
        shutil.rmtree(self.directory, ignore_errors=True)
