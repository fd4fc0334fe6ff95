"""`edgerun serve --workers N`: N gateway processes on one port, kept running by a supervisor.

Each worker is a whole `edgerun serve` (`--worker-index i`): its own event loop, app lifespan and
background tasks, binding the port with SO_REUSEPORT so the kernel spreads new connections over
the workers (gateway/http/listeners.py). Everything the workers must agree on goes through the
shared store, exactly as for gateway replicas on several machines: keys and limits, budgets,
request slots, in-flight counts, sessions, the prefix index, the ledger (idempotent by request
id). That store is Redis when `EDGERUN_REDIS_URL` is set; else the local store's SQLite file in its
shared mode (gateway/store/local/shared.py: every check-and-change under the file's one write
lock), which each worker opens itself (gateway/settings.py sets `sqlite_shared` for them) and
claims shared (gateway/store/local/file_claim.py), so no lone serve can take the file beside them.
What each worker keeps to itself is what a replica keeps: its health view of the backends (each
polls them), its tokenizer cache, its /metrics counters, its connection caps (`max_connections`,
`backend_max_connections` are per process). KV events drained by one worker's poll land in the
shared prefix index. The ledger spool is one file shared under a lock (gateway/billing/spool.py).

The supervisor starts the workers and waits for a signal to stop. A worker that dies is started
again; one that dies within `min_uptime_s` of its start (a port taken, a bad setting) or that
refused to start (`EXIT_REFUSED`: the file claimed by another serve) stops them all and the
supervisor exits with its status (1 for a refusal). A dead worker's
request slots and in-flight tokens stop counting within `inflight_lease_s` (its lease in the shared
tables). On SIGTERM / SIGINT / SIGHUP it stops the workers (each drains its streams as a lone
gateway does and settles its ledger records). A supervisor killed outright runs none of this: its
children get SIGTERM from the kernel (cli/parent_death.py, Linux) instead of serving on unsupervised.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

import structlog

from cli.parent_death import stop_with_parent

log = structlog.get_logger("edgerun.serve.workers")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# A worker's status for "refused to start" (sysexits' EX_CONFIG: the file claimed by another serve):
# the supervisor stops then however long the start took, where a slow machine's start could pass
# `min_uptime_s` and the worker be started again and again.
EXIT_REFUSED = 78


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
        min_uptime_s: float = 5.0,
        stop_timeout_s: float = 30.0,
    ) -> None:
        self.num_workers = num_workers
        self.argv_for = argv_for
        self.min_uptime_s = min_uptime_s
        self.stop_timeout_s = stop_timeout_s
        self.workers: list[Worker] = []
        self._stopping = False

    def _start(self, index: int) -> Worker:
        return Worker(index, subprocess.Popen(self.argv_for(index), preexec_fn=stop_with_parent()))

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stopping = True

    def run(self) -> int:
        """Start the workers and keep them running until one of STOP_SIGNALS; the exit status."""
        previous = {sig: signal.signal(sig, self._on_signal) for sig in STOP_SIGNALS}
        try:
            self.workers = [self._start(i) for i in range(self.num_workers)]
            log.info("workers started", workers=self.num_workers, pids=[w.process.pid for w in self.workers])
            status = self._watch()
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return status

    def _watch(self) -> int:
        while not self._stopping:
            time.sleep(0.2)
            for i, worker in enumerate(self.workers):
                code = worker.process.poll()
                if code is None or self._stopping:
                    continue
                if code == EXIT_REFUSED:
                    log.error("a worker refused to start; stopping", worker=worker.index)
                    return 1
                if time.monotonic() - worker.started < self.min_uptime_s:
                    log.error("worker exited at start; stopping", worker=worker.index, status=code)
                    return code or 1
                log.warning("worker exited; starting it again", worker=worker.index, status=code)
                time.sleep(1.0)
                self.workers[i] = self._start(worker.index)
        return 0

    def _stop_all(self) -> None:
        """Every worker (each drains its streams and settles its records), killed past the timeout."""
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
