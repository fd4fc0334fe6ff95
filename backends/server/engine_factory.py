"""Which engine a backend hosts, built from its settings (engines are imported only here, lazily)."""

from __future__ import annotations

from backends.settings import BackendSettings
from engines.base import Engine


def build_engine(settings: BackendSettings) -> Engine:
    """Load the configured engine (slow: loads the model). Call it off the event loop."""
    if settings.engine_kind == "builtin":
        from engines.builtin.async_engine import AsyncEngine

        return AsyncEngine(settings.engine)
    from engines.tensorrt_llm.adapter import TrtllmEngine

    return TrtllmEngine(settings.trtllm, settings.engine.max_model_len)


def engine_concurrency(settings: BackendSettings) -> int:
    """How many requests the engine runs at once (its batch), before any queueing."""
    if settings.engine_kind == "builtin":
        return settings.engine.max_num_seqs
    return settings.trtllm.max_batch_size
