"""`python -m gateway.store.host --socket PATH`: serve this machine's store to its gateway workers.

The store's settings are read as a gateway reads them (`EDGERUN_*` variables, the TOML file named
by `EDGERUN_CONFIG`); the host always keeps the one-process `EmbeddedStore` on `sqlite_path`, and
refuses to start where another host, or a lone `edgerun serve`, serves that file (file_claim.py).
Runs on uvloop where it is installed (as gateway workers do). Ready (one log line) once the socket
accepts connections; SIGTERM or SIGINT stops it: no new calls, the ones under way answered, the
store closed (queued ledger records commit), exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

import structlog

from cli.logs import configure_logging
from gateway.settings import GatewaySettings
from gateway.store.embedded import EmbeddedStore
from gateway.store.host.file_claim import FileInUse, claim
from gateway.store.host.server import StoreHost
from gateway.store.host.socket_file import SocketInUse
from gateway.store.settings import StoreSettings

log = structlog.get_logger("edgerun.store.host")


async def serve(settings: StoreSettings, path: str) -> int:
    """Run the host on `path` until SIGTERM or SIGINT; the process's exit status."""
    store = EmbeddedStore(settings.model_copy(update={"redis_url": None, "sqlite_shared": False, "store_socket": None}))
    host = StoreHost(store, path)
    try:
        claimed = claim(settings.sqlite_path, f"the store host on {path}")
        await host.start()
    except (FileInUse, SocketInUse, OSError) as exc:
        log.error("store_host_cannot_start", socket=path, error=str(exc))
        await store.aclose()
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("store_host_ready", socket=path, sqlite_path=settings.sqlite_path)
    await stop.wait()
    await host.close()
    if claimed is not None:
        os.close(claimed)
    log.info("store_host_stopped", socket=path)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.store.host", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, help="path of the Unix socket to serve on")
    args = parser.parse_args(argv)
    settings = GatewaySettings()
    configure_logging(settings.logging.log_level, settings.logging.log_json)
    try:  # the loop a gateway worker gets from uvicorn, where installed: ~10% less CPU per call here
        import uvloop
    except ImportError:
        return asyncio.run(serve(settings.store, args.socket))
    return uvloop.run(serve(settings.store, args.socket))


if __name__ == "__main__":
    sys.exit(main())
