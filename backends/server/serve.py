"""Run the backend app under uvicorn, with a graceful drain on SIGTERM / SIGINT.

uvicorn alone would close the listening socket at the first signal; we first drain instead
(health answers 503 so balancers move away, new requests get 503, admitted ones finish until
`shutdown_timeout_s`, the rest are aborted) and only then let uvicorn shut down. A second signal
falls back to uvicorn's own handling (a second Ctrl-C forces the exit).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from types import FrameType

import uvicorn

from backends.server.app import create_app, drain_and_stop
from backends.settings import BackendSettings

log = logging.getLogger("edgerun.backend")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._drain = drain
        self._loop: asyncio.AbstractEventLoop | None = None
        self._is_draining = False
        self._drain_task: asyncio.Task[None] | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._is_draining or self._loop is None or not self.started:
            super().handle_exit(sig, frame)
            return
        self._is_draining = True
        log.info("signal %d: draining before shutdown", sig)
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        async def drain_then_exit() -> None:
            try:
                await self._drain()
            finally:
                self.should_exit = True

        self._drain_task = asyncio.ensure_future(drain_then_exit())


def serve(settings: BackendSettings) -> int:
    """Serve until a signal ends the process; returns the exit code (1 if the engine failed to load)."""
    app = create_app(settings)
    state = app.state.backend
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,  # keep the process's structured logging
        access_log=False,
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s) + 10,  # backstop behind our own drain
    )
    server = DrainingServer(config, drain=lambda: drain_and_stop(state))
    failures: list[BaseException] = []

    def on_fatal(exc: BaseException) -> None:
        failures.append(exc)
        server.should_exit = True

    state.on_fatal = on_fatal
    server.run()
    return 1 if failures else 0
