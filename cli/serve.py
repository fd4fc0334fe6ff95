"""`edgerun serve`: run the gateway (settings from EDGERUN_* variables and the EDGERUN_CONFIG TOML)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys

import structlog

from cli.workers import EXIT_REFUSED, Supervisor
from gateway.http.app import create_app
from gateway.http.descriptors import raise_open_file_limit
from gateway.http.listeners import Listeners, listener_configs
from gateway.settings import GatewaySettings
from gateway.store.local.file_claim import FileInUse, claim

log = structlog.get_logger("edgerun.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="interface to listen on (default: settings.host, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default: settings.port, 8080)")
    parser.add_argument("--admin-port", type=int, help="separate admin listener for /admin and /metrics (default: none)")
    parser.add_argument("--admin-host", help="interface of the admin listener (default: settings.admin_host, 127.0.0.1)")
    parser.add_argument("--region", help="this gateway's region (default: settings.region)")
    parser.add_argument("--log-level", help="debug, info, warning, error")
    parser.add_argument(
        "--workers", type=int, help="gateway processes sharing the port and the store (default: settings.workers, 1)"
    )
    parser.add_argument("--worker-index", type=int, help=argparse.SUPPRESS)  # set by the supervisor


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    overrides = {
        name: getattr(args, name)
        for name in ("host", "port", "admin_host", "admin_port", "region", "log_level", "workers", "worker_index")
        if getattr(args, name, None) is not None
    }
    return GatewaySettings(**overrides)


def logging_options(args: argparse.Namespace) -> dict[str, object]:
    """How `edgerun` configures logging before `run` (see cli/main.py)."""
    settings = settings_from_args(args)
    return {"level": settings.logging.log_level, "json": settings.logging.log_json}


def quiet_http_client_logs(level: str) -> None:
    """httpx (the admin CLI's and the tests' client, not the backend path's) logs one INFO line per
    request: keep those for debugging only."""
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.DEBUG if level.lower() == "debug" else logging.WARNING)


# The cyclic garbage collector's first generation runs after this many more container objects were
# made than freed (CPython's default: 700). A request in flight holds a few hundred (coroutines,
# frames, dicts) that are freed by reference counting when it ends, so with tens of streams open the
# default ran a collection every few requests, each traversing every open request's objects: ~7% of
# the gateway's CPU. At 10,000 it runs about a hundred times less often (BENCHMARKS.md, "Gateway CPU per streamed
# request").
GC_GEN0_THRESHOLD = 10_000


def tune_gc() -> None:
    """Fewer young-generation collections, and the objects made at start-up (modules, the app)
    moved out of the collector's view for good: they live as long as the process."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def serve(settings: GatewaySettings) -> None:
    """The public listener, and the admin listener when `admin_port` is set (gateway/http/listeners.py)."""
    quiet_http_client_logs(settings.logging.log_level)
    raise_open_file_limit()  # before the listeners' caps are fitted under it (gateway/http/descriptors.py)
    app = create_app(settings)
    reuse_port = settings.http.worker_index is not None
    listeners = Listeners(listener_configs(settings, app), drain=app.state.drain, reuse_port=reuse_port)
    tune_gc()
    listeners.run()


def worker_argv(args: argparse.Namespace, index: int) -> list[str]:
    """The command line of worker `index`: this `edgerun serve` with the same options, as one worker."""
    argv = [sys.executable, "-m", "cli", "serve", "--worker-index", str(index)]
    for name in ("host", "port", "admin_host", "admin_port", "region", "log_level", "workers"):
        value = getattr(args, name, None)
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if settings.http.workers > 1 and settings.http.worker_index is None:
        return Supervisor(settings.http.workers, lambda index: worker_argv(args, index)).run()
    try:
        claimed = claim_store_file(settings)
    except FileInUse as exc:
        log.error("the SQLite file is in use; not serving", error=str(exc))
        # a worker says so to its supervisor, which then stops rather than start it again
        return 1 if settings.http.worker_index is None else EXIT_REFUSED
    try:
        serve(settings)
    finally:
        if claimed is not None:
            os.close(claimed)
    return 0


def claim_store_file(settings: GatewaySettings, command: str = "edgerun serve") -> int | None:
    """A serve on the local store claims its SQLite file until it has stopped serving: the lock's
    descriptor, or None where nothing is claimed (Redis; gateway/store/local/file_claim.py). One that
    keeps the one-process store claims it alone (FileInUse if another serve has it); one in the
    file's shared mode (a `--workers N` worker, or `sqlite_shared`) claims it shared: beside other
    such serves, never beside a lone one. `edgerun dev` serving in its own process claims the same
    way (`command` names it)."""
    store = settings.store
    if store.redis_url is not None:
        return None  # the state is kept in Redis
    holder = f"{command} on port {settings.http.port}" + (", shared mode" if store.sqlite_shared else "")
    return claim(store.sqlite_path, holder, shared=store.sqlite_shared)
