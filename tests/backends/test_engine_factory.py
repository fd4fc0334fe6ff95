"""Loading a backend's model (engine or encoder) off the event loop, on a thread that leaves nothing
running behind (engines/omp.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading

import httpx
import pytest

from backends.server.embedding_app import create_embedding_app
from backends.server.engine_factory import load_engine
from backends.settings import BackendSettings
from engines.omp import GOMP_SPIN_COUNT


def native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


async def settled_threads(at_most: int | None = None, timeout_s: float = 5.0) -> int:
    """The native thread count once it stops falling (a finished Python thread's OS thread, and
    the OpenMP team it led, exit a moment after `is_alive()` turns False)."""
    count = native_threads()
    for _ in range(int(timeout_s / 0.05)):
        await asyncio.sleep(0.05)
        now = native_threads()
        if now == count and (at_most is None or now <= at_most):
            break
        count = now
    return count


async def test_load_engine_leaves_no_thread_behind() -> None:
    # asyncio.to_thread's executor thread (and an OpenMP team of the torch ops it ran) outlived the
    # load and slowed every parallel op of the engine's steps (engine_factory.load_engine)
    settings = BackendSettings(engine={"model": "random:tiny", "num_kv_blocks": 16})
    python_threads = set(threading.enumerate())
    await load_engine(settings)  # a first load: torch's own one-off native threads start here
    assert set(threading.enumerate()) == python_threads
    before = await settled_threads()
    engine = await load_engine(settings)
    assert engine.model_name
    assert set(threading.enumerate()) == python_threads
    assert await settled_threads(at_most=before) == before


async def test_load_engine_raises_the_load_error() -> None:
    settings = BackendSettings(engine={"model": "random:no-such-preset"})
    with pytest.raises(ValueError, match="no-such-preset"):
        await load_engine(settings)


async def test_embedding_backend_loads_its_encoder_on_a_thread_that_exits() -> None:
    # the encoder used to load on asyncio.to_thread's executor thread, which lived on with its team
    app = create_embedding_app(BackendSettings())
    python_threads = set(threading.enumerate())
    async with app.router.lifespan_context(app):
        assert set(threading.enumerate()) == python_threads
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://backend") as client:
            assert (await client.get("/health")).json() == {"status": "ok", "model": "all-minilm-l6-v2"}
            answer = await client.post("/v1/embeddings", json={"input": "x"})
            assert answer.json()["usage"]["prompt_tokens"] == 3  # [CLS] x [SEP]: the encoder works


@pytest.mark.parametrize(("env", "expected"), [
    ({}, GOMP_SPIN_COUNT),
    ({"GOMP_SPINCOUNT": "300000"}, "300000"),  # the operator's choice stands
    ({"OMP_WAIT_POLICY": "passive"}, None),
])
@pytest.mark.process
def test_omp_spinning_is_bounded_before_torch_loads(env: dict[str, str], expected: str | None) -> None:
    code = ("import os; from engines.omp import may_bound_omp_spinning; "
            "may_bound_omp_spinning(); import torch; print(os.environ.get('GOMP_SPINCOUNT'))")
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(expected)
