"""The supervisor of `edgerun serve --workers N` (cli/workers.py), on small stand-in "worker" processes
that note when they start and stop. Every process appends its events to one file, in the order they
happen. (tests/gateway/e2e/test_serve_workers.py runs the real gateway and store.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cli.workers import EXIT_REFUSED, Supervisor

pytestmark = pytest.mark.process

EVENTS = """
import os, sys
def note(line):
    with open(sys.argv[1], "a") as events:
        events.write(line + "\\n")
"""

WORKER = (
    EVENTS
    + """
import signal, time
index = sys.argv[2]
note(f"worker {index} started {os.getpid()}")
def stop(signum, frame):
    note(f"worker {index} stopped")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
while True:
    time.sleep(1)
"""
)


def _supervisor(events: Path, script: str = WORKER, **options: float) -> Supervisor:
    return Supervisor(
        2,
        lambda i: [sys.executable, "-c", script, str(events), str(i)],
        min_uptime_s=options.pop("min_uptime_s", 0.5),
        stop_timeout_s=10,
    )


def _lines(events: Path) -> list[str]:
    return events.read_text().splitlines() if events.exists() else []


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _run_then(
    supervisor: Supervisor, act: Callable[[], None], *, then_sigterm: bool = True, stop: int = signal.SIGTERM
) -> int:
    """`supervisor.run()` here (its signal handlers need the main thread) while `act` runs beside it,
    then `stop` to this process (the supervisor's handler takes it: `act` must leave the supervisor
    running); whatever `act` raises is raised here after the supervisor returns."""
    failure: list[BaseException] = []

    def beside() -> None:
        try:
            act()
        except BaseException as exc:  # reported below, after the supervisor is stopped
            failure.append(exc)
        if then_sigterm:
            os.kill(os.getpid(), stop)
        elif failure:
            supervisor._on_signal(signal.SIGTERM, None)  # not this process's default handler: pytest would end

    thread = threading.Thread(target=beside)
    thread.start()
    try:
        status = supervisor.run()
    finally:
        thread.join()
    if failure:
        raise failure[0]
    return status


def _started(events: Path) -> int:
    return sum(" started " in line for line in _lines(events))


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])  # SIGHUP: the terminal went away
def test_workers_start_and_stop_on_a_signal(tmp_path: Path, stop: int) -> None:
    events = tmp_path / "events"
    assert _run_then(_supervisor(events), lambda: _wait_for(lambda: _started(events) == 2), stop=stop) == 0
    lines = _lines(events)
    assert sorted(line.rsplit(" ", 1)[0] for line in lines[:2]) == [f"worker {i} started" for i in (0, 1)]
    assert sorted(lines[2:]) == [f"worker {i} stopped" for i in (0, 1)]


def test_a_worker_that_exits_at_start_stops_the_serve_with_its_status(tmp_path: Path) -> None:
    events = tmp_path / "events"
    # a generous min_uptime_s: on a loaded machine the interpreter alone may take longer than the default here
    assert _supervisor(events, script="import sys; sys.exit(3)", min_uptime_s=30).run() == 3


def test_a_worker_that_refuses_to_start_stops_the_serve_however_late(tmp_path: Path) -> None:
    """A refusal (EXIT_REFUSED) after min_uptime_s, as on a machine so slow that a worker's imports
    take longer, still stops the serve with status 1 instead of starting the worker again and again."""
    events = tmp_path / "events"
    script = f"import time, sys; time.sleep(0.5); sys.exit({EXIT_REFUSED})"
    assert _supervisor(events, script=script, min_uptime_s=0.1).run() == 1


def test_a_killed_worker_is_started_again_and_the_others_keep_running(tmp_path: Path) -> None:
    events = tmp_path / "events"
    supervisor = _supervisor(events)

    def kill_a_worker() -> None:
        _wait_for(lambda: _started(events) == 2)
        time.sleep(0.6)  # past min_uptime_s: a crash, not a bad start
        first = next(line for line in _lines(events) if line.startswith("worker 0 started"))
        os.kill(int(first.rsplit(" ", 1)[1]), signal.SIGKILL)
        _wait_for(lambda: _started(events) == 3)

    assert _run_then(supervisor, kill_a_worker) == 0
    lines = _lines(events)
    assert sum(line.startswith("worker 0 started") for line in lines) == 2
    assert sum(line.startswith("worker 1 started") for line in lines) == 1  # the other was not restarted
    assert sorted(line for line in lines if line.endswith("stopped")) == ["worker 0 stopped", "worker 1 stopped"]


PID_WORKER = (
    EVENTS
    + """
import time
note(f"worker {os.getpid()} up")
while True:
    time.sleep(1)
"""
)

SUPERVISED = """
import sys
from cli.workers import EXIT_REFUSED, Supervisor
events, worker_script = sys.argv[1], sys.argv[2]
workers = Supervisor(2, lambda i: [sys.executable, worker_script, events], min_uptime_s=0.5)
sys.exit(workers.run())
"""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its reaper does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_killed_supervisor_takes_its_workers_with_it(tmp_path: Path) -> None:
    events = tmp_path / "events"
    (tmp_path / "worker.py").write_text(PID_WORKER)
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISED, str(events), str(tmp_path / "worker.py")])
    pids: list[int] = []
    try:
        _wait_for(lambda: sum(line.endswith(" up") for line in _lines(events)) == 2)
        pids = [int(line.split()[1]) for line in _lines(events)]
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        supervisor.kill()  # SIGKILL: no handler runs, nothing is stopped by the supervisor
        supervisor.wait()
        _wait_for(lambda: not any(_alive(pid) for pid in pids))  # nobody left serving the port or the store
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
