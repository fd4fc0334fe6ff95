"""Which engine a backend hosts, built from its settings (engines are imported only here, lazily)."""

from __future__ import annotations

from backends.settings import BackendSettings
from engines.base import Engine
from engines.omp import may_bound_omp_spinning, on_own_thread


def build_engine(settings: BackendSettings) -> Engine:
    """Load the configured engine (slow: loads the model). Call it off the event loop."""
    if settings.engine_kind == "builtin":
        from engines.builtin.engine.async_engine import AsyncEngine

        return AsyncEngine(settings.engine)
    from engines.tensorrt_llm.adapter import TrtllmEngine

    return TrtllmEngine(settings.trtllm, settings.engine.max_model_len)


async def load_engine(settings: BackendSettings) -> Engine:
    """`build_engine` on a thread that has exited when this returns, with bounded OpenMP spinning
    (engines/omp.py: the executor thread of `asyncio.to_thread` would keep a second OpenMP team
    alive, and the served engine's decode steps would sleep at every parallel op)."""
    may_bound_omp_spinning()
    return await on_own_thread(build_engine, settings, name="edgerun-engine-load")


def engine_concurrency(settings: BackendSettings) -> int:
    """How many requests the engine runs at once (its batch), before any queueing."""
    if settings.engine_kind == "builtin":
        return settings.engine.max_num_seqs
    return settings.trtllm.max_batch_size
