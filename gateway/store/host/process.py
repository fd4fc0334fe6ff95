"""Start a store host as its own process and wait until it serves (what a supervisor, a test or a
benchmark does): `python -m gateway.store.host --socket PATH` is ready once the socket accepts
connections."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping


def is_served(path: str) -> bool:
    """Whether something accepts connections on the Unix socket `path` now."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


class HostNotReady(RuntimeError):
    """The store host exited, or did not accept connections, before it was ready."""


def wait_served(
    host: subprocess.Popen[bytes], path: str, timeout_s: float, give_up: Callable[[], bool] = lambda: False
) -> bool:
    """Until `host` accepts connections on `path` (True), or `give_up()` is true first (False, not ready);
    HostNotReady if it exits first or `timeout_s` runs out (it is left running then)."""
    deadline = time.monotonic() + timeout_s
    while not give_up():
        if host.poll() is not None:
            raise HostNotReady(f"the store host exited with status {host.returncode} before serving on {path}")
        if is_served(path):
            return True
        if time.monotonic() > deadline:
            raise HostNotReady(f"the store host did not serve on {path} within {timeout_s:g} s")
        time.sleep(0.02)
    return False


def start_host(path: str, env: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> subprocess.Popen[bytes]:
    """The host process serving on `path` (settings from `env`, as a gateway's); HostNotReady if it
    exits first or is not ready within `timeout_s` (it is killed then)."""
    host = subprocess.Popen([sys.executable, "-m", "gateway.store.host", "--socket", path], env=env)
    try:
        wait_served(host, path, timeout_s)
    except HostNotReady:
        host.kill()
        host.wait()
        raise
    return host
