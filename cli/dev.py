"""`edgerun dev` (what `make run` starts): one backend and one gateway on this machine.

1. spawns `edgerun backend --model smollm2` as a child process on a free loopback port and waits
   until its /health answers 200 (the model loads in a few seconds once converted); a random
   backend API key made for this run (passed in the child's environment, never on its command
   line) is the one the gateway sends, so only this gateway can use the backend;
2. opens the embedded store (its own SQLite file under ~/.local/share/edgerun), makes sure a
   development tenant owning account "dev" exists and creates a fresh API key for it;
3. starts the gateway in this process, in front of that backend (the admin API and /metrics on
   their own loopback listener, --admin-port), and prints a curl command that works as printed;
4. on Ctrl-C (or SIGTERM) stops the gateway, then the backend, and waits for both.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from pydantic import SecretStr

from gateway.app import create_app
from gateway.catalog import DEFAULT_MODEL_ID
from cli.serve import quiet_http_client_logs
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_backend(args: argparse.Namespace, port: int, api_key: str) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "cli",
        "backend",
        "--model",
        args.model,
        "--port",
        str(port),
        "--region",
        "local",
        "--log-level",
        args.log_level,
    ]
    return subprocess.Popen(command, env={**os.environ, "EDGERUN_API_KEY": api_key})


async def wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SystemExit(f"the backend exited with code {process.returncode} before becoming healthy")
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.25)
    raise SystemExit(f"the backend did not become healthy within {timeout_s:.0f}s")


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
        await wait_healthy(f"http://127.0.0.1:{backend_port}/health", backend, BACKEND_START_TIMEOUT_S)
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
                f"admin API and /metrics: http://127.0.0.1:{args.admin_port} "
                f"(admin token: {settings.admin_token.get_secret_value()})\n\n"
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
        stop_backend(backend)
    return 0


def stop_backend(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def logging_options(args: argparse.Namespace) -> dict[str, object]:
    """Console logs at --log-level (see cli/main.py)."""
    return {"level": args.log_level, "json": False}


def run(args: argparse.Namespace) -> int:
    quiet_http_client_logs(args.log_level)
    try:
        return asyncio.run(serve_dev(args))
    except KeyboardInterrupt:
        return 0
