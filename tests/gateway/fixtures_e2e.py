"""Real processes on loopback for the gateway's end-to-end tests.

- `BackendProcess`: `python -m gateway.cli backend --model smollm2 ...` (the real model).
- `InProcessGateway`: the gateway app under uvicorn on a loopback port, in a thread with its own
  event loop (fast to start; the test can reach its store with `call`).
- `GatewayProcess`: `python -m gateway.cli serve` as a subprocess (where processes are the point).

Session fixtures (registered in tests/gateway/conftest.py): two backends `b1`, `b2` in region
"local", and one in-process gateway in front of them with the catalog model served by both and
a second model id served by `b1` only (for tests that must land on one backend).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import structlog
import uvicorn

from gateway.app import create_app
from gateway.catalog import DEFAULT_MODEL_ID
from gateway.settings import GatewaySettings
from gateway.store import Store, open_store

ROOT = Path(__file__).resolve().parents[2]
SINGLE_MODEL_ID = "@cf/test/smollm2-on-b1"  # the same weights, served by b1 only
ADMIN_TOKEN = "test-admin-token"
BACKEND_READY_TIMEOUT_S = 180.0
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class BackendProcess:
    id: str
    region: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spec(self, models: list[str] | None = None) -> dict[str, Any]:
        return {"id": self.id, "base_url": self.url, "region": self.region, "models": models or [DEFAULT_MODEL_ID]}

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = BACKEND_READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"backend {self.id} exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"backend {self.id} not ready within {timeout_s}s:\n{self.log()[-3000:]}")
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL: the process vanishes mid-whatever, as a crashed host would."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            self.log_path.unlink()


def start_backend(backend_id: str, region: str = "local", *flags: str) -> BackendProcess:
    """Spawn a real smollm2 backend (not yet ready: call `wait_ready`)."""
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix=f"edgerun-{backend_id}-", suffix=".log", delete=False)
    command = [
        sys.executable,
        "-m",
        "gateway.cli",
        "backend",
        "--model",
        "smollm2",
        "--port",
        str(port),
        "--region",
        region,
        "--log-level",
        "warning",
        *flags,
    ]
    process = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, "EDGERUN_LOG_JSON": "false"}, stdout=log, stderr=subprocess.STDOUT
    )
    log.close()
    return BackendProcess(backend_id, region, port, process, Path(log.name))


@contextlib.contextmanager
def running_backends(*ids_and_regions: tuple[str, str]) -> Iterator[list[BackendProcess]]:
    """Start several backends at once and wait for all; stop them at the end."""
    started = [start_backend(backend_id, region) for backend_id, region in ids_and_regions]
    try:
        with ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(lambda b: b.wait_ready(), started))
        yield started
    finally:
        for backend in started:
            backend.stop()


@dataclass
class InProcessGateway:
    """The gateway app on a loopback port, served from a thread with its own event loop."""

    settings: GatewaySettings
    port: int = field(default_factory=free_port)
    store: Store | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine (e.g. on the store) on the gateway's loop and wait for its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def start(self) -> InProcessGateway:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per backend request
        # The access log would land in captured stdout (structlog's default); tests read it otherwise.
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self.store = open_store(self.settings)
            config = uvicorn.Config(
                create_app(self.settings, store=self.store),
                host="127.0.0.1",
                port=self.port,
                log_config=None,
                access_log=False,
                lifespan="on",
            )
            self._server = uvicorn.Server(config)
            self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # not the main thread
            ready.set()
            try:
                loop.run_until_complete(self._server.serve())
                loop.run_until_complete(self.store.aclose())
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, name=f"gateway-{self.port}", daemon=True)
        self._thread.start()
        ready.wait(10)
        deadline = time.monotonic() + 20
        while not (self._server is not None and self._server.started):
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the in-process gateway did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)

    def new_key(self, tenant_id: str, account_id: str, **key_options: Any) -> str:
        """A fresh key for `tenant_id` (created, owning `account_id`, on first use)."""
        assert self.store is not None
        store = self.store

        async def make() -> str:
            if await store.get_tenant(tenant_id) is None:
                await store.create_tenant(tenant_id, [account_id], tenant_id=tenant_id)
            _, secret = await store.create_key(tenant_id, **key_options)
            return secret

        return self.call(make())


def gateway_settings(tmp: Path, backends: list[dict[str, Any]], **overrides: Any) -> GatewaySettings:
    values: dict[str, Any] = {
        "redis_url": None,
        "sqlite_path": str(tmp / "gateway.sqlite3"),
        "tokenizer_cache_dir": tmp / "tokenizers",
        "admin_token": ADMIN_TOKEN,
        "backends": backends,
        "models": [
            {"id": DEFAULT_MODEL_ID, "backend_model": "smollm2"},
            {"id": SINGLE_MODEL_ID, "backend_model": "smollm2"},
        ],
        "log_level": "warning",
        **overrides,
    }
    return GatewaySettings(**values)


@dataclass
class GatewayProcess:
    """`python -m gateway.cli serve` with settings passed as EDGERUN_* variables."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code < 500:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"gateway not ready within {timeout_s}s:\n{self.log()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        with contextlib.suppress(OSError):
            self.log_path.unlink()


def start_gateway_process(env_settings: dict[str, str]) -> GatewayProcess:
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix=f"edgerun-gateway-{port}-", suffix=".log", delete=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGERUN_")}
    env.update(env_settings)
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    return GatewayProcess(port, process, Path(log.name))


# ---- session fixtures (registered in conftest.py) ----------------------------------------------


@pytest.fixture(scope="session")
def backend_pair() -> Iterator[list[BackendProcess]]:
    """Two real smollm2 backends, b1 and b2, both in region "local"."""
    with running_backends(("b1", "local"), ("b2", "local")) as started:
        yield started


@pytest.fixture(scope="session")
def gateway(backend_pair: list[BackendProcess], tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    b1, b2 = backend_pair
    backends = [b1.spec([DEFAULT_MODEL_ID, SINGLE_MODEL_ID]), b2.spec([DEFAULT_MODEL_ID])]
    settings = gateway_settings(tmp_path_factory.mktemp("gateway"), backends, health_interval_s=0.5)
    started = InProcessGateway(settings).start()
    yield started
    started.stop()
