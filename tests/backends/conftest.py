"""Real backend processes on loopback for the backend tests (one per test module)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class BackendProcess:
    url: str
    port: int
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def load(self) -> dict:
        return httpx.get(f"{self.url}/load", timeout=5).json()

    def wait_until(self, predicate, timeout_s: float = 10.0, interval_s: float = 0.05) -> dict:  # noqa: ANN001
        """Poll /load until predicate(load) holds; returns that load (fails the test on timeout)."""
        deadline = time.monotonic() + timeout_s
        load = self.load()
        while not predicate(load):
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout_s}s; last /load: {load}")
            time.sleep(interval_s)
            load = self.load()
        return load


@contextlib.contextmanager
def running_backend(*flags: str, ready_timeout_s: float = 120.0) -> Iterator[BackendProcess]:
    """`python -m gateway.cli backend --port N *flags`, yielded once /health answers 200."""
    port = free_port()
    log_file = tempfile.NamedTemporaryFile(prefix=f"edgerun-backend-{port}-", suffix=".log", delete=False)
    command = [sys.executable, "-m", "gateway.cli", "backend", "--port", str(port), *flags]
    env = {**os.environ, "EDGERUN_LOG_JSON": "false"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    backend = BackendProcess(f"http://127.0.0.1:{port}", port, process, Path(log_file.name))
    try:
        deadline = time.monotonic() + ready_timeout_s
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"backend exited with {process.returncode}:\n{backend.log()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{backend.url}/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"backend not ready within {ready_timeout_s}s:\n{backend.log()[-3000:]}")
            time.sleep(0.2)
        yield backend
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log_file.close()
        os.unlink(log_file.name)


def long_prompt_ids(num_tokens: int, offset: int = 0) -> list[int]:
    """A deterministic prompt of ordinary vocabulary ids (no special tokens)."""
    return [1000 + (offset + 7 * i) % 20000 for i in range(num_tokens)]
