"""Child processes on loopback, in one place: start one (`python -m cli <command> --port N ...`,
or any command line), wait until it is ready, stop it (SIGTERM, then SIGKILL after a grace period).

`edgerun dev`, the load-test stack (loadtests/stack.py), the benchmarks and the test fixtures
(backends, gateways, redis-server) all start their children through `ChildProcess`. Each child
writes stdout and stderr to one log file (or, with `inherit_output`, to this process's own); a
child that exits or is not ready in time fails the wait with its log's tail. A log in a
temporary file is deleted by `stop`; one the caller named is kept. `free_port` is the one way to
pick a port.

`threads` sets the child's `OMP_NUM_THREADS` (torch reads it at import). On a small shared machine
oversubscribed OpenMP threads spin against each other: `threads_per_backend` gives each of several
busy backends its share of the cores, leaving one to the gateway and the client driving it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import httpx

ROOT = Path(__file__).resolve().parents[1]


class ProcessError(RuntimeError):
    """A child process exited, or did not answer, before it was ready."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def threads_per_backend(num_backends: int) -> int:
    """Torch threads for each of `num_backends` busy backends: (cores - 1) // num_backends, at least 1."""
    return max(1, ((os.cpu_count() or 1) - 1) // num_backends)


def child_env(extra: Mapping[str, str], *, keep_edgerun: bool, threads: int | None) -> dict[str, str]:
    """This process's environment plus `extra`; `keep_edgerun=False` drops inherited EDGERUN_* variables."""
    env = {k: v for k, v in os.environ.items() if keep_edgerun or not k.startswith("EDGERUN_")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    env.update(extra)
    return env


@dataclass
class ChildProcess:
    """One child process listening on a loopback port."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path | None  # None: the child writes to this process's stdout and stderr
    delete_log: bool = False  # `stop` removes the log (a temporary file)
    own_group: bool = False  # the child leads a process group of its own: `kill` and `stop` end all of it

    @classmethod
    def spawn(
        cls, name: str, command: str, args: Sequence[str] = (), *, port: int | None = None, **options: Any
    ) -> Self:
        """Start `python -m cli <command> --port <port> <args>` (not yet ready: call `wait_ready`).

        port: None picks a free one. options: as for `launch`.
        """
        port = port or free_port()
        argv = [sys.executable, "-m", "cli", command, "--port", str(port), *args]
        return cls.launch(name, argv, port, **options)

    @classmethod
    def launch(
        cls,
        name: str,
        argv: Sequence[str],
        port: int,
        *,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
        keep_edgerun_env: bool = False,
        threads: int | None = None,
        inherit_output: bool = False,
        cwd: Path = ROOT,
        own_group: bool = False,
        **fields: Any,
    ) -> Self:
        """Start any `argv` that will listen on `port` (not yet ready: call `wait_ready` or `wait_until_ready`).

        log_path: None logs to a temporary file that `stop` deletes. env: variables added to this
        process's environment, whose EDGERUN_* variables are dropped unless `keep_edgerun_env`.
        threads: the child's OMP_NUM_THREADS; None leaves torch's default. inherit_output: the
        child writes to this process's stdout and stderr instead of a log. cwd: where it runs (a
        benchmark's baseline runs `python -m cli` from another checkout). own_group: start it as
        the leader of a new process group, for a child that starts children of its own which would
        outlive a SIGKILL of their parent (a vLLM server's engine processes). fields: a subclass's own.
        """
        full_env = child_env(env or {}, keep_edgerun=keep_edgerun_env, threads=threads)
        if inherit_output:
            process = subprocess.Popen(argv, cwd=cwd, env=full_env, start_new_session=own_group)
            return cls(name, port, process, None, False, own_group, **fields)
        delete_log = log_path is None
        if log_path is None:
            with tempfile.NamedTemporaryFile(prefix=f"edgerun-{name}-{port}-", suffix=".log", delete=False) as tmp:
                log_path = Path(tmp.name)
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=own_group
            )
        return cls(name, port, process, log_path, delete_log, own_group, **fields)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        if self.log_path is not None:
            with contextlib.suppress(OSError):
                return self.log_path.read_text(errors="replace")
        return ""

    def log_tail(self, num_chars: int = 3000) -> str:
        return self.log()[-num_chars:]

    def wait_ready(
        self, path: str = "/health", timeout_s: float = 60.0, *, ok_statuses: Container[int] = (200,)
    ) -> None:
        """Poll GET `path` until it answers with one of `ok_statuses` (ProcessError on exit or timeout)."""

        def answers() -> bool:
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(self.url + path, timeout=2.0).status_code in ok_statuses
            return False

        self.wait_until_ready(answers, timeout_s)

    def wait_until_ready(self, is_ready: Callable[[], bool], timeout_s: float = 60.0, interval_s: float = 0.2) -> None:
        """Poll `is_ready()` until it is true (ProcessError if the child exits first or time runs out)."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise ProcessError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            if is_ready():
                return
            if time.monotonic() > deadline:
                raise ProcessError(f"{self.name} not ready within {timeout_s:.0f}s:\n{self.log_tail()}")
            time.sleep(interval_s)

    def kill(self) -> None:
        """SIGKILL: the process (with its group, if it leads one) vanishes mid-whatever, as a crashed host would."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._kill_group()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (the child drains), then SIGKILL if it is still there after `timeout_s`; what is
        left of its process group, if it leads one, is killed then."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        self._kill_group()
        if self.delete_log and self.log_path is not None:
            with contextlib.suppress(OSError):
                self.log_path.unlink()

    def _kill_group(self) -> None:
        if self.own_group:
            with contextlib.suppress(ProcessLookupError):  # the group is gone already
                os.killpg(self.process.pid, signal.SIGKILL)
