"""The supervisor of `edgerun serve --workers N` (cli/workers.py) with its store host
(cli/store_host.py), on small stand-in processes: a "host" that listens on the socket and a
"worker" that notes the socket it was given and, when told to stop, whether the host still
accepted then. Every process appends its events to one file, in the order they happen.
(tests/gateway/test_serve_workers.py runs the real gateway, host and store.)"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cli.store_host import STORE_SOCKET_ENV, StoreHost, needs_store_host, private_directory
from cli.workers import Supervisor
from gateway.store.host.process import is_served
from gateway.store.settings import StoreSettings

pytestmark = pytest.mark.process

EVENTS = """
import os, sys
def note(line):
    with open(sys.argv[1], "a") as events:
        events.write(line + "\\n")
"""

HOST = (
    EVENTS
    + """
import signal, socket, time
path = sys.argv[2]
if os.path.exists(path):
    os.unlink(path)
if len(sys.argv) > 3:
    time.sleep(float(sys.argv[3]))  # slow to listen
server = socket.socket(socket.AF_UNIX)
server.bind(path)
server.listen()
note(f"host {os.getpid()} listening")
def stop(signum, frame):
    note(f"host {os.getpid()} stopped")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(1)
"""
)

WORKER = (
    EVENTS
    + """
import signal, socket, time
index, path = sys.argv[2], os.environ["EDGERUN_STORE_SOCKET"]
note(f"worker {index} started {path}")
def stop(signum, frame):
    with socket.socket(socket.AF_UNIX) as sock:
        alive = sock.connect_ex(path) == 0
    note(f"worker {index} stopped, host accepting: {alive}")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
while True:
    time.sleep(1)
"""
)


def _host(events: Path, *extra: str, script: str = HOST) -> StoreHost:
    directory = private_directory(0)
    return StoreHost(directory, [sys.executable, "-c", script, str(events), str(directory / "store.sock"), *extra])


def _supervisor(events: Path, host: StoreHost, **options: float) -> Supervisor:
    return Supervisor(
        2,
        lambda i: [sys.executable, "-c", WORKER, str(events), str(i)],
        host=host,
        min_uptime_s=options.pop("min_uptime_s", 0.5),
        stop_timeout_s=10,
        **options,
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


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP])  # SIGHUP: the terminal went away
def test_workers_start_on_a_ready_host_and_stop_before_it(tmp_path: Path, stop: int) -> None:
    events = tmp_path / "events"
    host = _host(events)
    supervisor = _supervisor(events, host)

    def two_workers_up() -> None:
        _wait_for(lambda: sum(" started " in line for line in _lines(events)) == 2)
        assert stat.S_IMODE(host.directory.stat().st_mode) == 0o700
        assert host.process is not None and os.getpgid(host.process.pid) == host.process.pid  # not the terminal's group

    assert _run_then(supervisor, two_workers_up, stop=stop) == 0
    lines = _lines(events)
    assert lines[0].startswith("host ") and lines[0].endswith(" listening")  # the host first, ready
    assert sorted(lines[1:3]) == [f"worker {i} started {host.socket_path}" for i in (0, 1)]
    # the workers stop while the host still accepts, and the host stops after them
    assert sorted(lines[3:5]) == [f"worker {i} stopped, host accepting: True" for i in (0, 1)]
    assert lines[5].endswith(" stopped") and len(lines) == 6
    assert not host.directory.exists()  # the socket and its directory are gone


def test_a_host_that_exits_at_start_stops_the_serve_with_its_status(tmp_path: Path) -> None:
    events = tmp_path / "events"
    host = _host(events, script="import sys; sys.exit(3)")
    assert _supervisor(events, host).run() == 3
    assert _lines(events) == []  # no worker started
    assert not host.directory.exists()


def test_a_host_that_does_not_listen_in_time_stops_the_serve(tmp_path: Path) -> None:
    events = tmp_path / "events"
    host = _host(events, "60")  # listens only after a minute
    started = time.monotonic()
    assert _supervisor(events, host, host_ready_timeout_s=1.0).run() == 1
    assert time.monotonic() - started < 30  # bounded by the timeout, not the host's minute
    assert _lines(events) == []
    assert host.poll() is not None and not host.directory.exists()  # the host is stopped


def test_a_killed_host_is_started_again_and_the_workers_keep_running(tmp_path: Path) -> None:
    events = tmp_path / "events"
    host = _host(events)
    supervisor = _supervisor(events, host)
    pids: list[int] = []

    def kill_the_host() -> None:
        _wait_for(lambda: sum(" started " in line for line in _lines(events)) == 2)
        time.sleep(0.6)  # past min_uptime_s: a crash, not a bad start
        assert host.process is not None
        pids.append(host.process.pid)
        os.kill(host.process.pid, signal.SIGKILL)
        _wait_for(lambda: sum(line.endswith(" listening") for line in _lines(events)) == 2)
        assert host.process.pid != pids[0] and is_served(str(host.socket_path))
        pids.append(host.process.pid)

    assert _run_then(supervisor, kill_the_host) == 0
    lines = _lines(events)
    assert [line for line in lines if line.startswith("host ")] == [
        f"host {pids[0]} listening",
        f"host {pids[1]} listening",
        f"host {pids[1]} stopped",
    ]
    assert sum(" started " in line for line in lines) == 2  # the workers were not restarted
    assert sum(line.endswith("host accepting: True") for line in lines) == 2


def test_a_host_dying_right_after_its_start_stops_the_serve(tmp_path: Path) -> None:
    events = tmp_path / "events"
    host = _host(events)
    supervisor = _supervisor(events, host, min_uptime_s=30)

    def kill_the_host() -> None:
        _wait_for(lambda: sum(" started " in line for line in _lines(events)) == 2)
        assert host.process is not None
        os.kill(host.process.pid, signal.SIGKILL)

    assert _run_then(supervisor, kill_the_host, then_sigterm=False) == -signal.SIGKILL
    assert sum(line.endswith(" listening") for line in _lines(events)) == 1  # not started again
    assert not host.directory.exists()


def test_workers_get_the_socket_in_their_environment(tmp_path: Path) -> None:
    host = _host(tmp_path / "events")
    try:
        assert host.env == {STORE_SOCKET_ENV: str(host.directory / "store.sock")}
        assert host.directory.name.startswith("edgerun-0-")
        other = _host(tmp_path / "events")
        assert other.directory != host.directory  # two serves never share one, even on one port
        other.remove()
    finally:
        host.remove()
    assert not host.directory.exists()


def test_serve_starts_a_host_only_for_workers_without_another_shared_store() -> None:
    assert needs_store_host(StoreSettings(sqlite_path="/tmp/w.sqlite3"))
    assert not needs_store_host(StoreSettings(redis_url="redis://127.0.0.1:6379/0"))
    assert not needs_store_host(StoreSettings(sqlite_shared=True))  # several serves on one file: by choice
    assert not needs_store_host(StoreSettings(store_socket="/run/edgerun/store.sock"))  # a host run elsewhere


def test_the_socket_directory_is_under_the_runtime_directory_when_it_can_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    directory = private_directory(8080)
    assert directory.parent == tmp_path and directory.name.startswith("edgerun-8080-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "missing"))
    fallback = private_directory(8080)
    assert fallback.parent == Path(tempfile.gettempdir())
    fallback.rmdir()


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
from pathlib import Path
from cli.store_host import StoreHost
from cli.workers import Supervisor
events, directory, host_script, worker_script = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
host = StoreHost(directory, [sys.executable, host_script, events, str(directory / "store.sock")])
workers = Supervisor(2, lambda i: [sys.executable, worker_script, events], host=host, min_uptime_s=0.5)
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
def test_a_killed_supervisor_takes_its_host_and_workers_with_it(tmp_path: Path) -> None:
    events = tmp_path / "events"
    (tmp_path / "host.py").write_text(HOST)
    (tmp_path / "worker.py").write_text(PID_WORKER)
    directory = private_directory(0)
    argv = [str(tmp_path / name) for name in ("host.py", "worker.py")]
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISED, str(events), str(directory), *argv])
    pids: list[int] = []
    try:
        _wait_for(lambda: sum(line.endswith(" up") for line in _lines(events)) == 2)
        pids = [int(line.split()[1]) for line in _lines(events)]  # the host's, then the workers'
        assert len(pids) == 3 and all(_alive(pid) for pid in pids)
        supervisor.kill()  # SIGKILL: no handler runs, nothing is stopped by the supervisor
        supervisor.wait()
        _wait_for(lambda: not any(_alive(pid) for pid in pids))  # nobody left serving the port or the store
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(directory, ignore_errors=True)
