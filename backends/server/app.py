"""The backend's Starlette app and its lifespan, which owns the engine.

Start-up: the app answers at once (/health 503 "starting") while the engine loads in a thread of
its own (engine_factory.load_engine); when it has started, /health turns 200 and requests are
admitted. If loading fails the error is logged and `state.on_fatal` (set by serve.py) stops the
process.

Shutdown (`drain_and_stop`, run by serve.py on SIGTERM and again by the lifespan as a safety
net): refuse new requests (503, /health 503 "draining"), let admitted ones finish for up to
`settings.shutdown_timeout_s`, abort the rest (their streams end with finish_reason "abort"),
then stop the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response

from backends.server.admission import Admission, Phase
from backends.server.auth import BearerAuth
from backends.server.disconnect import ClientGone
from backends.server.engine_factory import engine_concurrency, load_engine
from backends.server.errors import EXCEPTION_HANDLERS
from backends.server.routes import ROUTES
from backends.server.state import BackendState
from backends.settings import BackendSettings
from engines.base import Engine

log = logging.getLogger("edgerun.backend")
ABORT_TIMEOUT_S = 5.0


async def _client_gone(request: Request, exc: Exception) -> Response:
    return Response(status_code=499)  # nobody reads it: the client has left


def create_app(settings: BackendSettings, engine: Engine | None = None) -> Starlette:
    """The backend app for `settings`; pass `engine` to host an already built one (not started)."""
    running = engine_concurrency(settings)
    state = BackendState(settings, Admission(max_in_flight=running + settings.max_queue, max_running=running))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        loader = asyncio.create_task(_load(state, engine), name="edgerun-engine-load")
        try:
            yield
        finally:
            if not loader.done():
                loader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await loader
            await drain_and_stop(state)

    api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    app = Starlette(
        routes=ROUTES,
        lifespan=lifespan,
        exception_handlers={**EXCEPTION_HANDLERS, ClientGone: _client_gone},
        middleware=[Middleware(BearerAuth, api_key=api_key)],  # every route but GET /health
    )
    app.state.backend = state
    return app


async def _load(state: BackendState, engine: Engine | None) -> None:
    settings = state.settings
    try:
        if engine is None:
            engine = await load_engine(settings)
        await engine.start()
        await _may_start_kv(state, engine)
    except Exception as exc:
        state.load_error = f"{type(exc).__name__}: {exc}"
        log.exception("the engine failed to load")
        if state.on_fatal is not None:
            state.on_fatal(exc)
        return
    state.attach(engine)
    log.info(
        "backend ready: model=%s region=%s role=%s max_in_flight=%d",
        state.model_name, settings.region, settings.role, state.admission.max_in_flight,
    )


async def _may_start_kv(state: BackendState, engine: Engine) -> None:
    """KV transfer for disaggregated serving: the built-in engine on CPU only."""
    if state.settings.engine_kind != "builtin":
        return
    from engines.builtin.engine.async_engine import AsyncEngine

    if not isinstance(engine, AsyncEngine) or engine.engine.runner.device.type != "cpu":
        return
    from backends.server.kv_service import KVService

    kv = KVService(state.settings, engine, state.metrics)
    await kv.start()
    state.kv = kv
    if state.settings.kv_region_pool_master is not None:
        from backends.server.region_service import RegionPoolService

        region = RegionPoolService(state.settings, engine, state.metrics)
        await region.start()
        state.region = region


async def drain_and_stop(state: BackendState) -> None:
    """Graceful shutdown; idempotent (later calls wait for the first one to finish)."""
    if state.stopping is None:
        state.stopping = asyncio.ensure_future(_drain_and_stop(state))
    await asyncio.shield(state.stopping)


async def _drain_and_stop(state: BackendState) -> None:
    admission = state.admission
    remaining = await admission.drain(state.settings.shutdown_timeout_s)
    engine = state.engine
    if remaining and engine is not None:
        log.warning("aborting %d requests still running after %.1fs", len(remaining), state.settings.shutdown_timeout_s)
        for request_id in remaining:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(engine.abort(request_id), ABORT_TIMEOUT_S)
        await admission.drain(ABORT_TIMEOUT_S)  # let the aborted streams write their last chunk
    admission.phase = Phase.STOPPED
    if state.kv is not None:
        await state.kv.stop()
    if state.region is not None:
        await state.region.stop()
    if engine is not None:
        await engine.stop(timeout_s=ABORT_TIMEOUT_S)
