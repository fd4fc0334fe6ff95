"""Torch's OpenMP threads and the Python threads that run torch work.

libgomp gives every Python thread that runs a parallel torch op a team of worker threads of its
own, alive as long as that thread is. It counts the threads of every team in the process, and once
they outnumber the CPUs it barely spins at its barriers in any team (100 spins, then a futex sleep):
each parallel op of a decode step then pays a sleep and a wake-up (a served engine decoded a third
slower than the same engine in-process: BENCHMARKS.md, "The serving path at batch 1"). So heavy
loads (a model, an encoder) run on a thread that exits afterwards (`on_own_thread`), never on
`asyncio.to_thread`'s executor thread or a thread that lives on (the main thread of a server),
and the one thread that runs the model afterwards holds the only team.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# OpenMP threads spin this many times at a barrier before they sleep (libgomp's default, ~300,000,
# is milliseconds): long enough to stay awake between the parallel ops of one decode step on an idle
# machine, short enough that on a busy one a thread whose partner lost its CPU soon yields its own
# (with the default a served stream decoded ~20x slower at load 13: BENCHMARKS.md).
GOMP_SPIN_COUNT = "10000"


def may_bound_omp_spinning() -> None:
    """Set GOMP_SPINCOUNT before torch (and its libgomp) loads, unless the operator chose an OpenMP
    wait policy already; libgomp reads it once, when it loads."""
    if "torch" not in sys.modules and "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = GOMP_SPIN_COUNT


async def on_own_thread(fn: Callable[..., T], *args: Any, name: str = "edgerun-load") -> T:
    """`fn(*args)` on a thread of its own, which has exited (its OpenMP team with it) when this
    returns; errors propagate. Not `asyncio.to_thread`, whose executor thread outlives the call."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def run() -> None:
        outcome: tuple[Any, BaseException | None]
        try:
            outcome = fn(*args), None
        except BaseException as exc:  # handed to the awaiting task
            outcome = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, done, *outcome)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        return await done
    finally:
        while thread.is_alive():  # it is returning: its OpenMP team goes with it
            await asyncio.sleep(0.005)


def _settle(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.done():  # cancelled while loading
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
