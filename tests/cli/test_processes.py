"""cli/processes.py: the one place that starts a child, waits for it and stops it."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from cli.processes import ChildProcess, ProcessError, free_port

pytestmark = pytest.mark.process


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


def is_running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie may linger where nothing reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("ending", ["kill", "stop"])
def test_a_group_leader_takes_its_own_children_with_it(ending: str) -> None:
    """A vLLM server's engine processes outlive a SIGKILL of the server: `own_group` ends them too."""
    code = (
        "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); print(p.pid, flush=True); time.sleep(60)"
    )
    child = ChildProcess.launch("parent", [sys.executable, "-c", code], 1, own_group=True)
    try:
        child.wait_until_ready(lambda: child.log().strip().isdigit(), timeout_s=30, interval_s=0.05)
        grandchild = int(child.log())
        assert is_running(grandchild)
        getattr(child, ending)()
        deadline = time.monotonic() + 10
        while is_running(grandchild):
            assert time.monotonic() < deadline, "the child's own child outlived it"
            time.sleep(0.05)
    finally:
        child.stop(timeout_s=5)
