"""`edgerun dev` (what `make run` starts): one backend and one gateway on this machine.

1. spawns `edgerun backend --model smollm2` as a child process (cli/processes.py) on a free
   loopback port and waits until its /health answers 200 (the model loads in a few seconds once
   converted); a random backend API key made for this run (passed in the child's environment, never on its command
   line) is the one the gateway sends, so only this gateway can use the backend;
2. opens the embedded store (its own SQLite file under ~/.local/share/edgerun), makes sure a
   development tenant owning account "dev" exists and creates a fresh API key for it;
3. starts the gateway in this process, in front of that backend (the admin API, /metrics and the
   admin's dashboard on their own loopback listener, --admin-port), and prints a curl command that
   works as printed, the admin token and the usage dashboard's URLs;
4. on Ctrl-C (or SIGTERM) stops the gateway, then the backend, and waits for both.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shlex
from pathlib import Path

from pydantic import SecretStr

from cli.processes import ChildProcess, ProcessError, free_port
from cli.serve import quiet_http_client_logs
from gateway.app import create_app
from gateway.catalog import DEFAULT_MODEL_ID
from gateway.listeners import Listeners, listener_configs
from gateway.settings import GatewaySettings
from gateway.store.base import Store

DEV_TENANT = "dev"
DEV_ACCOUNT = "dev"
BACKEND_START_TIMEOUT_S = 600.0  # the first start converts the GGUF weights once


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    parser.add_argument("--admin-port", type=int, default=8081, help="admin API and /metrics port (default 8081)")
    parser.add_argument("--backend-port", type=int, help="backend port (default: a free one)")
    parser.add_argument("--model", default="smollm2", help="what the backend loads (default smollm2)")
    parser.add_argument("--sqlite-path", default=str(Path.home() / ".local" / "share" / "edgerun" / "dev.sqlite3"))
    parser.add_argument("--log-level", default="warning", help="gateway and backend log level (default warning)")


def spawn_backend(args: argparse.Namespace, port: int, api_key: str) -> ChildProcess:
    """`edgerun backend` as a child writing to this terminal (not yet ready: see `wait_backend`)."""
    options = ["--model", args.model, "--region", "local", "--log-level", args.log_level]
    return ChildProcess.spawn(
        "the backend", "backend", options, port=port, env={"EDGERUN_API_KEY": api_key}, keep_edgerun_env=True,
        inherit_output=True,
    )


def wait_backend(backend: ChildProcess) -> None:
    try:
        backend.wait_ready("/health", BACKEND_START_TIMEOUT_S)
    except ProcessError as exc:
        raise SystemExit(f"{exc} (before becoming healthy)") from None


async def dev_key(store: Store) -> str:
    if await store.get_tenant(DEV_TENANT) is None:
        await store.create_tenant("Development", [DEV_ACCOUNT], tenant_id=DEV_TENANT)
    _, secret = await store.create_key(DEV_TENANT)
    return secret


def curl_line(port: int, secret: str) -> str:
    url = f"http://127.0.0.1:{port}/client/v4/accounts/{DEV_ACCOUNT}/ai/run/{DEFAULT_MODEL_ID}"
    body = json.dumps({"prompt": "What is the capital of France?", "max_tokens": 32})
    return f"curl {url} -H {shlex.quote('Authorization: Bearer ' + secret)} -d {shlex.quote(body)}"


async def serve_dev(args: argparse.Namespace) -> int:
    backend_port = args.backend_port or free_port()
    backend_key = secrets.token_urlsafe(32)
    backend = spawn_backend(args, backend_port, backend_key)
    try:
        print(f"starting the backend ({args.model}) on 127.0.0.1:{backend_port} ...", flush=True)
        wait_backend(backend)
        Path(args.sqlite_path).parent.mkdir(parents=True, exist_ok=True)
        settings = GatewaySettings(
            port=args.port,
            sqlite_path=args.sqlite_path,
            redis_url=None,
            admin_token=secrets.token_urlsafe(32),
            admin_port=args.admin_port,
            backend_api_key=SecretStr(backend_key),
            backends=[{"id": "local-1", "base_url": f"http://127.0.0.1:{backend_port}", "region": "local"}],
            log_level=args.log_level,
        )
        from gateway.store import open_store

        store = open_store(settings)
        try:
            secret = await dev_key(store)
            listeners = Listeners(listener_configs(settings, create_app(settings, store=store)))
            serving = asyncio.create_task(listeners.serve())
            while not listeners.started and not serving.done():
                await asyncio.sleep(0.05)
            if serving.done():
                await serving
                return 1
            assert settings.admin_token is not None
            print(
                f"\nedgerun is running: gateway http://127.0.0.1:{args.port} -> backend http://127.0.0.1:{backend_port}\n"
                f"development key (tenant {DEV_TENANT!r}, account {DEV_ACCOUNT!r}): {secret}\n"
                f"admin API and /metrics: http://127.0.0.1:{args.admin_port}\n"
                f"admin token: {settings.admin_token.get_secret_value()}\n"
                f"usage dashboard: http://127.0.0.1:{args.admin_port}/dashboard (log in with the admin token); "
                f"http://127.0.0.1:{args.port}/dashboard with the development key (its tenant alone)\n\n"
                f"try:\n\n  {curl_line(args.port, secret)}\n\n"
                '(add "stream": true for server-sent events; OpenAI clients use base URL '
                f"http://127.0.0.1:{args.port}/client/v4/accounts/{DEV_ACCOUNT}/ai/v1)\n"
                "Ctrl-C stops both.\n",
                flush=True,
            )
            await serving
        finally:
            await store.aclose()
    finally:
        backend.stop(timeout_s=15)
    return 0


def logging_options(args: argparse.Namespace) -> dict[str, object]:
    """Console logs at --log-level (see cli/main.py)."""
    return {"level": args.log_level, "json": False}


def run(args: argparse.Namespace) -> int:
    quiet_http_client_logs(args.log_level)
    try:
        return asyncio.run(serve_dev(args))
    except KeyboardInterrupt:
        return 0
