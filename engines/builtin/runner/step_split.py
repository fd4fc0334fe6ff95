"""One step of several sequences, split into parts that run at once on one-thread workers (CPU).

Torch spreads each op over its OpenMP threads, and every op of a step ends at a barrier where the
threads wait for the slowest one. A decode step of SmolLM2 runs ~1,000 ops, so that is ~1,000
barriers per step: on a 2-core machine they cost little only while nothing else runs, and on a busy
one a thread whose partner lost its CPU waits at every op (a 16-row decode step took 3x the wall
time of one thread's, at load 9; what splitting gains: BENCHMARKS.md, "Step workers"). Sequences do
not depend on one another within a step, so instead the step's items are split into parts of about
equal size, and each part runs a whole forward pass on a worker thread with one torch thread: no
barrier until the step ends. Each part reads every weight once (weights are read in parallel, not
shared), which is why a step with one big item (a long prefill chunk) is not split: it runs alone
with every torch thread.

The workers call `torch.set_num_threads(1)` on their own thread (OpenMP's thread count is per
thread); torch also keeps that value as the default of threads that start later, so the
constructing thread restores it once every worker has set its own. (A thread's first torch call
sets its count from that default, so each worker makes one before setting its own.)
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from typing import Any, TypeVar

import torch

T = TypeVar("T")

# A step is split only when its largest part holds at most 1/parts + SPLIT_SLACK of its tokens:
# with 2 parts, 65%. Past that the big part on one thread would take longer than the whole step
# on every thread.
SPLIT_SLACK = 0.15
# ... and into at most one part per this many tokens: a part of fewer rows is bound by reading the
# weights (every part reads all of them), so many one-row parts on a many-core machine would not pay.
MIN_PART_TOKENS = 4


def plan_parts(costs: Sequence[int], num_parts: int) -> list[list[int]] | None:
    """Indices of `costs` (tokens per item) in up to `num_parts` parts of about equal total (longest first,
    each into the lightest part), each part's indices ascending; None when fewer than two parts fit (items,
    MIN_PART_TOKENS) or when the largest part would hold more than 1/parts + SPLIT_SLACK of the total."""
    num_parts = min(num_parts, len(costs), sum(costs) // MIN_PART_TOKENS)
    if num_parts < 2:
        return None
    parts: list[list[int]] = [[] for _ in range(num_parts)]
    loads = [0] * num_parts
    for i in sorted(range(len(costs)), key=lambda i: -costs[i]):
        lightest = loads.index(min(loads))
        parts[lightest].append(i)
        loads[lightest] += costs[i]
    if max(loads) > sum(costs) * (1 / num_parts + SPLIT_SLACK):
        return None
    return [sorted(part) for part in parts]


class StepWorkers:
    """`num_workers` daemon threads with one torch thread each, started by the first `map` and stopped by
    `close`; `map(fn, args)` runs fn on every arg at once (one arg per worker at most) and returns the
    results in order, raising the first error."""

    def __init__(self, num_workers: int) -> None:
        if num_workers < 2:
            raise ValueError("StepWorkers needs at least 2 workers")
        self.num_workers = num_workers
        self.tasks: queue.SimpleQueue[tuple[Callable[[Any], Any], Any, Future[Any]] | None] = queue.SimpleQueue()
        self.threads: list[threading.Thread] = []  # started by the first `map`, on the thread that steps

    def start(self) -> None:
        """Start the workers (`map` does when they are not running). They start from the thread that runs the
        steps, not from the one that built the runner: a backend builds it on a load thread that exits."""
        restore = torch.get_num_threads()
        ready = threading.Barrier(self.num_workers + 1)
        self.threads = [
            threading.Thread(target=self._serve, args=(self.tasks, ready), name=f"edgerun-step-{i}", daemon=True)
            for i in range(self.num_workers)
        ]
        for thread in self.threads:
            thread.start()
        ready.wait()
        torch.set_num_threads(restore)

    @staticmethod
    def _serve(tasks: queue.SimpleQueue[tuple[Callable[[Any], Any], Any, Future[Any]] | None],
               ready: threading.Barrier) -> None:
        torch.get_num_threads()  # torch's first call on a thread sets its count from the default: do it now
        torch.set_num_threads(1)
        ready.wait()
        while (task := tasks.get()) is not None:
            fn, arg, future = task
            try:
                future.set_result(fn(arg))
            except BaseException as exc:  # handed to the caller of map
                future.set_exception(exc)

    def map(self, fn: Callable[[Any], T], args: Sequence[Any]) -> list[T]:
        if len(args) > self.num_workers:
            raise ValueError(f"{len(args)} tasks for {self.num_workers} workers")
        if not self.threads:
            self.start()
        futures: list[Future[T]] = [Future() for _ in args]
        for arg, future in zip(args, futures):
            self.tasks.put((fn, arg, future))
        wait(futures)  # every part done before an error propagates: they write into shared state
        return [future.result() for future in futures]

    def close(self) -> None:
        """Let the workers exit (each takes one stop from the queue it serves); a later `map` starts new ones."""
        for _ in self.threads:
            self.tasks.put(None)
        self.tasks = queue.SimpleQueue()
        self.threads = []
