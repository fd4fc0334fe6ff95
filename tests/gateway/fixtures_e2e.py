"""Real processes on loopback for the gateway's end-to-end tests.

- `BackendProcess`: `python -m cli backend --model smollm2 ...` (the real model), with its
  share of the cores as torch threads (cli/processes.py starts and stops the processes).
- `InProcessGateway`: the gateway app under uvicorn on a loopback port, in a thread with its own
  event loop (fast to start; the test can reach its store with `call`).
- `GatewayProcess`: `python -m cli serve` as a subprocess (where processes are the point).

Session fixtures (registered in tests/gateway/conftest.py): two backends `b1`, `b2` in region
"local", and one in-process gateway in front of them with the catalog model served by both and
a second model id served by `b1` only (for tests that must land on one backend).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Container, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import structlog

from cli.processes import ChildProcess, free_port, threads_per_backend
from gateway.billing.savings import record_savings
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.http.app import create_app
from gateway.http.listeners import Listeners, listener_configs
from gateway.services import Services
from gateway.settings import GatewaySettings
from gateway.store import Store, open_store
from gateway.store.models import UsageRecord

SINGLE_MODEL_ID = "@cf/test/smollm2-on-b1"  # the same weights, served by b1 only
LLAMA_ALIAS = "@cf/meta/llama-3.1-8b-instruct"  # the `gateway` fixture's alias of DEFAULT_MODEL_ID
ADMIN_TOKEN = "test-admin-token-0123456789abcdefghij"  # settings want >= 32 characters
BACKEND_READY_TIMEOUT_S = 180.0
T = TypeVar("T")


@dataclass
class BackendProcess(ChildProcess):
    """`python -m cli backend --model smollm2 ...`; `name` is its backend id."""

    region: str = "local"

    def spec(self, models: list[str] | None = None) -> dict[str, Any]:
        return {"id": self.name, "base_url": self.url, "region": self.region, "models": models or [DEFAULT_MODEL_ID]}

    def wait_ready(
        self, path: str = "/health", timeout_s: float = BACKEND_READY_TIMEOUT_S, *, ok_statuses: Container[int] = (200,)
    ) -> None:
        super().wait_ready(path, timeout_s, ok_statuses=ok_statuses)


def start_backend(backend_id: str, region: str = "local", *flags: str, threads: int | None = None) -> BackendProcess:
    """Spawn a real smollm2 backend (not yet ready: call `wait_ready`).

    threads: its torch threads; None: its share of the cores beside the two session backends.
    """
    # float16 weights (fbgemm, float32 sums): the fast mode's 4-bit/bfloat16 paths may pick another
    # token where a disaggregated or failed-over request runs other batch shapes than a collocated one,
    # and these tests compare those answers token for token
    args = ["--model", "smollm2", "--weight-dtype", "float16", "--region", region, "--log-level", "warning", *flags]
    return BackendProcess.spawn(
        backend_id, "backend", args, env={"EDGERUN_LOG_JSON": "false"}, keep_edgerun_env=True,
        threads=threads or threads_per_backend(3), region=region,
    )


@contextlib.contextmanager
def serving(started: list[BackendProcess]) -> Iterator[list[BackendProcess]]:
    """Wait for spawned backends (all at once), hand them out, stop them at the end."""
    try:
        with ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(lambda b: b.wait_ready(), started))
        yield started
    finally:
        for backend in started:
            backend.stop()


@contextlib.contextmanager
def running_backends(*ids_and_regions: tuple[str, str]) -> Iterator[list[BackendProcess]]:
    """Start several backends at once (each with its share of the cores), wait for all; stop them at the end."""
    threads = threads_per_backend(len(ids_and_regions))
    with serving([start_backend(backend_id, region, threads=threads) for backend_id, region in ids_and_regions]) as started:
        yield started


@contextlib.contextmanager
def running_tiny_backend(name: str, *flags: str, env: dict[str, str] | None = None) -> Iterator[BackendProcess]:
    """A backend serving `random:tiny` (random weights: ready at once), stopped at the end."""
    args = ["--model", "random:tiny", "--log-level", "warning", *flags]  # a later --log-level wins
    process = BackendProcess.spawn(name, "backend", args, env={"EDGERUN_LOG_JSON": "false", **(env or {})})
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


@contextlib.contextmanager
def held_stream(url: str, secret: str, body: dict[str, Any]) -> Iterator[None]:
    """A streamed request to `url`, held open (its first chunk read) until the block ends, then abandoned."""
    with httpx.stream("POST", url, json={**body, "stream": True}, headers={"authorization": f"Bearer {secret}"},
                      timeout=60) as response:
        assert response.status_code == 200
        lines = response.iter_lines()  # kept referenced: a collected iterator closes the connection
        for line in lines:
            if line.startswith("data: {"):
                break
        yield


@dataclass
class InProcessGateway:
    """The gateway app on a loopback port, served from a thread with its own event loop."""

    settings: GatewaySettings
    port: int = field(default_factory=free_port)
    admin_port: int | None = None  # a free port when settings.admin_port is set
    store: Store | None = None
    wrap_store: Callable[[Store], Store] | None = None  # e.g. a counting wrapper (tests/gateway/store/counting.py)
    _loop: asyncio.AbstractEventLoop | None = None
    _listeners: Listeners | None = None
    _thread: threading.Thread | None = None
    app: Any = None  # the Starlette app, once started: `services` reaches its parts

    @property
    def services(self) -> Services:
        """The app's services (monitor, router, metrics, ...); use them on the gateway's loop (`call`)."""
        return self.app.state.services  # type: ignore[no-any-return]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        """The admin listener's URL, or the public one when there is no separate admin listener."""
        return f"http://127.0.0.1:{self.admin_port}" if self.admin_port is not None else self.url

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine (e.g. on the store) on the gateway's loop and wait for its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def ledger_record(self, request_id: str, timeout_s: float = 10.0) -> UsageRecord:
        """The request's ledger record, waiting for it: records are written just after the response ends."""
        assert self.store is not None
        deadline = time.monotonic() + timeout_s
        while (record := self.call(self.store.ledger.get(request_id))) is None:
            assert time.monotonic() < deadline, f"no ledger record for {request_id}"
            time.sleep(0.05)
        return record

    def start(self) -> InProcessGateway:
        logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per backend request
        # The access log would land in captured stdout (structlog's default); tests read it otherwise.
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self.store = open_store(self.settings.store, record_savings(self.settings.billing))
            if self.wrap_store is not None:
                self.store = self.wrap_store(self.store)
            if self.settings.http.admin_port is not None and self.admin_port is None:
                self.admin_port = free_port()
            app = self.app = create_app(self.settings, store=self.store)
            configs = listener_configs(self.settings, app, port=self.port, admin_port=self.admin_port)
            self._listeners = Listeners(configs, drain=app.state.drain)  # signals stay the main thread's: this is another one
            ready.set()
            try:
                loop.run_until_complete(self._listeners.serve())
                loop.run_until_complete(self.store.aclose())
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, name=f"gateway-{self.port}", daemon=True)
        self._thread.start()
        ready.wait(10)
        deadline = time.monotonic() + 20
        while not (self._listeners is not None and self._listeners.started):
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the in-process gateway did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._listeners is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._listeners.stop)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def new_key(self, tenant_id: str, account_id: str, **key_options: Any) -> str:
        """A fresh key for `tenant_id` (created, owning `account_id`, on first use)."""
        assert self.store is not None
        store = self.store

        async def make() -> str:
            if await store.tenancy.get_tenant(tenant_id) is None:
                await store.tenancy.create_tenant(tenant_id, [account_id], tenant_id=tenant_id)
            _, secret = await store.tenancy.create_key(tenant_id, **key_options)
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
        "shutdown_timeout_s": 5.0,  # a test stopping with a stream still open waits this long, not 30 s
        "metrics_public": True,  # the tests read /metrics without a token; tests/gateway/http/test_listeners.py checks it
        **overrides,
    }
    return GatewaySettings(**values)


class GatewayProcess(ChildProcess):
    """`python -m cli serve` with settings passed as EDGERUN_* variables."""

    def wait_ready(
        self, path: str = "/healthz", timeout_s: float = 30.0, *, ok_statuses: Container[int] = range(500)
    ) -> None:
        """Up once /healthz answers at all (503 too: a gateway whose backends are down is running)."""
        super().wait_ready(path, timeout_s, ok_statuses=ok_statuses)


def start_gateway_process(env_settings: dict[str, str]) -> GatewayProcess:
    """Spawn `edgerun serve` with `env_settings` and none of this process's EDGERUN_* variables."""
    return GatewayProcess.spawn("gateway", "serve", env=env_settings)


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
    tmp = tmp_path_factory.mktemp("gateway")
    settings = gateway_settings(tmp, backends, health_interval_s=0.5, model_aliases={LLAMA_ALIAS: DEFAULT_MODEL_ID})
    started = InProcessGateway(settings).start()
    yield started
    started.stop()


@contextlib.contextmanager
def running_child(name: str, command: Callable[[int], list[str]], timeout_s: float = 60) -> Iterator[ChildProcess]:
    """A child server (`command(port)`, a stub) on a free port, ready at /health, stopped at the end."""
    port = free_port()
    child = ChildProcess.launch(name, command(port), port)
    try:
        child.wait_ready("/health", timeout_s=timeout_s)
        yield child
    finally:
        child.stop()


@pytest.fixture(scope="session")
def stub_backend() -> Iterator[ChildProcess]:
    """tests/gateway/stub_backend.py (64 chunks an answer) for the tests where the model adds nothing:
    faults between gateway and backend, fuzzing the gateway's API."""
    from tests.gateway import stub_backend as stub

    with running_child("stub backend", lambda port: stub.command(port, num_chunks=64)) as child:
        yield child


SLOW_STUB_CHUNKS, SLOW_STUB_DELAY_MS = 40, 100  # 4-second streams


@pytest.fixture(scope="session")
def slow_stub_backend() -> Iterator[ChildProcess]:
    """The stub backend with 40 chunks 100 ms apart (4-second streams): shutdown, deadlines, overload."""
    from tests.gateway import stub_backend as stub

    with running_child("slow stub backend", lambda port: stub.command(port, SLOW_STUB_CHUNKS, SLOW_STUB_DELAY_MS)) as child:
        yield child


EMBEDDING_BACKEND_KEY = "embedding-backend-test-secret-0123456789"
# The embedding backend's queue, small enough that a few requests reach its bounds: passes of 256
# tokens (one text at all-MiniLM-L6-v2's 256-token limit), 4096 tokens waiting per tenant, 8192 in all.
EMBEDDING_QUEUE = {"batch_tokens": 256, "tenant_max_queued_tokens": 4096, "max_queued_tokens": 8192}
FULL_TEXT = "Café au lait, s'il vous plaît! 東京 " * 40  # truncated to all-MiniLM-L6-v2's 256 tokens: a pass each
FULL_TOKENS = 256


def embedding_metric(backend: ChildProcess, name: str) -> float:
    """One sample of an embedding backend's /metrics, by name and labels (`..._texts_total{outcome="dropped"}`)."""
    headers = {"authorization": f"Bearer {EMBEDDING_BACKEND_KEY}"}
    text = httpx.get(f"{backend.url}/metrics", headers=headers, timeout=10).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics:\n{text}")


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture(scope="session")
def embedding_backend() -> Iterator[ChildProcess]:
    """One `edgerun backend --engine embedding` (all-MiniLM-L6-v2, queue bounds EMBEDDING_QUEUE) for
    every test that needs one."""
    options = ["--engine", "embedding", "--log-level", "warning"]
    env = {"EDGERUN_API_KEY": EMBEDDING_BACKEND_KEY}
    env.update({f"EDGERUN_EMBEDDING_{name.upper()}": str(value) for name, value in EMBEDDING_QUEUE.items()})
    child = ChildProcess.spawn("embedding backend", "backend", options, env=env)
    try:
        child.wait_ready("/health", timeout_s=120)
        yield child
    finally:
        child.stop()
