"""Start a store host as its own process and wait until it serves (what a supervisor, a test or a
benchmark does): `python -m gateway.store.host --socket PATH` is ready once the socket accepts
connections."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Mapping


def is_served(path: str) -> bool:
    """Whether something accepts connections on the Unix socket `path` now."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def start_host(path: str, env: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> subprocess.Popen[bytes]:
    """The host process serving on `path` (settings from `env`, as a gateway's); RuntimeError if it
    exits first or is not ready within `timeout_s` (it is killed then)."""
    host = subprocess.Popen([sys.executable, "-m", "gateway.store.host", "--socket", path], env=env)
    deadline = time.monotonic() + timeout_s
    while not is_served(path):
        if host.poll() is not None:
            raise RuntimeError(f"the store host exited with status {host.returncode} before serving on {path}")
        if time.monotonic() > deadline:
            host.kill()
            host.wait()
            raise RuntimeError(f"the store host did not serve on {path} within {timeout_s:g} s")
        time.sleep(0.02)
    return host
