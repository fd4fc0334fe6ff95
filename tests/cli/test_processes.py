"""cli/processes.py: the one place that starts a child, waits for it and stops it."""

from __future__ import annotations

import sys

import pytest

from cli.processes import ChildProcess, ProcessError, free_port


def test_a_child_is_ready_once_it_answers_and_stop_removes_its_log() -> None:
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    server = ChildProcess.launch("http.server", argv, port)
    try:
        server.wait_ready("/", timeout_s=30)
        assert server.process.poll() is None and server.url == f"http://127.0.0.1:{port}"
    finally:
        server.stop(timeout_s=10)
    assert server.process.returncode is not None
    assert server.log_path is not None and not server.log_path.exists()


def test_a_child_that_exits_fails_the_wait_with_its_output() -> None:
    child = ChildProcess.launch("doomed", [sys.executable, "-c", "print('no model here'); raise SystemExit(3)"], 1)
    with pytest.raises(ProcessError, match=r"(?s)doomed exited with 3:.*no model here"):
        child.wait_until_ready(lambda: False, timeout_s=30, interval_s=0.05)
    child.stop()


def test_a_child_that_never_gets_ready_times_out() -> None:
    child = ChildProcess.launch("sleeper", [sys.executable, "-c", "import time; time.sleep(30)"], 1)
    try:
        with pytest.raises(ProcessError, match="sleeper not ready within 0s"):
            child.wait_until_ready(lambda: False, timeout_s=0.2, interval_s=0.05)
    finally:
        child.stop(timeout_s=5)
    assert child.process.returncode is not None
