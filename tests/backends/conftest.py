"""Real backend processes on loopback for the backend tests (one per test module)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import httpx

from cli.processes import ChildProcess

READY_TIMEOUT_S = 120.0


class BackendProcess(ChildProcess):
    def load(self) -> dict:
        return httpx.get(f"{self.url}/load", timeout=5).json()

    def wait_until(self, predicate: Callable[[dict], bool], timeout_s: float = 10.0, interval_s: float = 0.05) -> dict:
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
def running_backend(
    *flags: str, ready_timeout_s: float = READY_TIMEOUT_S, env: dict[str, str] | None = None
) -> Iterator[BackendProcess]:
    """`python -m cli backend --port N *flags`, yielded once /health answers 200.

    One backend alone on the machine: torch's default threads (all cores) prefill fastest.
    `env`: more EDGERUN_* settings (e.g. EDGERUN_API_KEY).
    """
    env = {"EDGERUN_LOG_JSON": "false", **(env or {})}
    backend = BackendProcess.spawn("backend", "backend", flags, env=env, keep_edgerun_env=True)
    try:
        backend.wait_ready("/health", ready_timeout_s)
        yield backend
    finally:
        backend.stop()


def long_prompt_ids(num_tokens: int, offset: int = 0) -> list[int]:
    """A deterministic prompt of ordinary vocabulary ids (no special tokens)."""
    return [1000 + (offset + 7 * i) % 20000 for i in range(num_tokens)]
