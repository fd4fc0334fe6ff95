"""Which engine a backend hosts, built from its settings (engines are imported only here, lazily)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
from typing import Any

from backends.settings import BackendSettings
from engines.base import Engine


def build_engine(settings: BackendSettings) -> Engine:
    """Load the configured engine (slow: loads the model). Call it off the event loop."""
    if settings.engine_kind == "builtin":
        from engines.builtin.async_engine import AsyncEngine

        return AsyncEngine(settings.engine)
    from engines.tensorrt_llm.adapter import TrtllmEngine

    return TrtllmEngine(settings.trtllm, settings.engine.max_model_len)


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


async def load_engine(settings: BackendSettings) -> Engine:
    """`build_engine` on a thread of its own, which has exited when this returns.

    Not `asyncio.to_thread`: the executor's thread outlives the call, and the torch ops the load
    ran on it keep an OpenMP thread team alive with it. libgomp counts the threads of every team in
    the process, and once they outnumber the CPUs it barely spins at its barriers in any team (100
    spins, then a futex sleep): each of the engine's parallel ops in a decode step then paid a sleep
    and a wake-up, and the served engine decoded a third slower than the same engine in-process
    (BENCHMARKS.md, "The serving path at batch 1"). What it gets instead is bounded spinning
    (`may_bound_omp_spinning`).
    """
    may_bound_omp_spinning()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Engine] = loop.create_future()

    def run() -> None:
        outcome: tuple[Engine | None, BaseException | None]
        try:
            outcome = build_engine(settings), None
        except BaseException as exc:  # handed to the awaiting task
            outcome = None, exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, done, *outcome)

    thread = threading.Thread(target=run, name="edgerun-engine-load", daemon=True)
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


def engine_concurrency(settings: BackendSettings) -> int:
    """How many requests the engine runs at once (its batch), before any queueing."""
    if settings.engine_kind == "builtin":
        return settings.engine.max_num_seqs
    return settings.trtllm.max_batch_size
