"""`edgerun serve --workers N`: N gateway processes on one port, kept running by a supervisor.

Each worker is a whole `edgerun serve` (`--worker-index i`): its own event loop, app lifespan and
background tasks, binding the port with SO_REUSEPORT so the kernel spreads new connections over
the workers (gateway/http/listeners.py). Everything the workers must agree on goes through the
shared store, exactly as for gateway replicas on several machines: keys and limits, budgets,
request slots, in-flight counts, sessions, the prefix index, the ledger (idempotent by request
id). That store is Redis when `EDGERUN_REDIS_URL` is set; else a store host that the supervisor
starts first (cli/store_host.py: one process owning the embedded store on `sqlite_path`, which the
workers reach over a Unix socket, `EDGERUN_STORE_SOCKET`); or, with an explicit
`sqlite_shared = true`, the embedded store's SQLite file in its shared mode
(gateway/store/embedded_shared.py), which also serves several separate `edgerun serve` on one file.
What each worker keeps to itself is what a replica keeps: its health view of the backends (each
polls them), its tokenizer cache, its /metrics counters, its connection caps (`max_connections`,
`backend_max_connections` are per process). KV events drained by one worker's poll land in the
shared prefix index. The ledger spool is one file shared under a lock (gateway/billing/spool.py).

The supervisor starts the host and waits until its socket accepts (15 s at most, else it exits
with the host's status, or 1), then starts the workers, and waits for a signal to stop. A worker or
a host that dies is started again (a host at once and not waited for: the workers answer 503 until
it accepts and reconnect to it by themselves); one that dies within `min_uptime_s` of its start (a port taken, a bad
setting) stops them all and the supervisor exits with its status. On SIGTERM / SIGINT / SIGHUP it
stops the workers first (each drains its streams as a lone gateway does and settles its ledger
records through the host), then the host (it closes the store), then removes the socket's
directory. (The host has its own process group, which a closed terminal's SIGHUP does not reach:
the supervisor stops it then too, rather than dying and leaving it behind.)
A supervisor killed outright runs none of this: its children get SIGTERM from the kernel
(cli/parent_death.py, Linux) instead of serving on unsupervised.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

import structlog

from cli.parent_death import stop_with_parent
from cli.store_host import StoreHost
from gateway.store.host.process import HostNotReady

log = structlog.get_logger("edgerun.serve.workers")

HOST_READY_TIMEOUT_S = 15.0  # from the host's start until its socket accepts
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(slots=True)
class Worker:
    index: int
    process: subprocess.Popen[bytes]
    started: float = field(default_factory=time.monotonic)


class Supervisor:
    def __init__(
        self,
        num_workers: int,
        argv_for: Callable[[int], list[str]],
        *,
        host: StoreHost | None = None,
        min_uptime_s: float = 5.0,
        stop_timeout_s: float = 30.0,
        host_ready_timeout_s: float = HOST_READY_TIMEOUT_S,
    ) -> None:
        self.num_workers = num_workers
        self.argv_for = argv_for
        self.host = host
        self.min_uptime_s = min_uptime_s
        self.stop_timeout_s = stop_timeout_s
        self.host_ready_timeout_s = host_ready_timeout_s
        self.workers: list[Worker] = []
        self._stopping = False

    def _start(self, index: int) -> Worker:
        env = None if self.host is None else {**os.environ, **self.host.env}
        return Worker(index, subprocess.Popen(self.argv_for(index), env=env, preexec_fn=stop_with_parent()))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def _start_host(self) -> None:
        """Start the store host and wait until it accepts (HostNotReady if it does not)."""
        assert self.host is not None
        self.host.start()
        self.host.wait_ready(self.host_ready_timeout_s, give_up=lambda: self._stopping)

    def run(self) -> int:
        """Start the store host (if any), then the workers, and keep them running until one of
        STOP_SIGNALS; the exit status."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            if self.host is not None:
                self._start_host()
                log.info("store host started", socket=str(self.host.socket_path))
            if self._stopping:
                return 0
            self.workers = [self._start(i) for i in range(self.num_workers)]
            log.info("workers started", workers=self.num_workers, pids=[w.process.pid for w in self.workers])
            status = self._watch()
        except HostNotReady as exc:
            log.error("store host not ready; stopping", error=str(exc))
            status = self._host_status()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return status

    def _host_status(self) -> int:
        """The host's exit status when it exited with one, else 1."""
        code = self.host.poll() if self.host is not None else None
        return code or 1

    def _watch(self) -> int:
        while not self._stopping:
            time.sleep(0.2)
            if self.host is not None and not self._stopping and (code := self.host.poll()) is not None:
                if time.monotonic() - self.host.started < self.min_uptime_s:
                    log.error("store host exited at start; stopping", status=code)
                    return code or 1
                # not waited for: the workers answer 503 until it accepts, and reconnect on their next store call
                log.warning("store host exited; starting it again", status=code)
                self.host.start()
            for i, worker in enumerate(self.workers):
                code = worker.process.poll()
                if code is None or self._stopping:
                    continue
                if time.monotonic() - worker.started < self.min_uptime_s:
                    log.error("worker exited at start; stopping", worker=worker.index, status=code)
                    return code or 1
                log.warning("worker exited; starting it again", worker=worker.index, status=code)
                time.sleep(1.0)
                self.workers[i] = self._start(worker.index)
        return 0

    def _stop_all(self) -> None:
        """The workers first (they drain their streams and settle their records through the host),
        then the host (it closes the store), then the host's directory."""
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout_s
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker did not stop in time; killing it", worker=worker.index)
                worker.process.kill()
                worker.process.wait()
        if self.host is not None:
            if not self.host.stop(self.stop_timeout_s):
                log.warning("store host did not stop in time; killed it")
            self.host.remove()
