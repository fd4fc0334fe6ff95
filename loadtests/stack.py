"""Start real backends and a gateway on loopback for a load test, and stop them afterwards.

`running_stack(StackConfig(...))` spawns N `edgerun backend --model smollm2` processes and
one `edgerun serve` whose settings come from a generated TOML file (`EDGERUN_CONFIG`) listing
those backends, with an admin token for provisioning tenants. The routing policy is given to the
gateway as `EDGERUN_ROUTING_POLICY`, as an operator would. Inherited `EDGERUN_*` variables are
dropped so the stack does not pick up the caller's settings. Each process logs to a file in the
work directory; a process that dies before it is ready fails the start with its log's tail.

Backends run with `OMP_NUM_THREADS` = (cores - 1) / backends, at least 1, leaving a core to the
gateway and the load generator: on a small shared machine, oversubscribed OpenMP threads spin
against each other (on a busy 2-core machine one thread per backend answered 5x sooner than two).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 300.0  # a first start converts the GGUF weights once


class StackError(RuntimeError):
    """A process of the stack failed to start."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(slots=True)
class Service:
    """One child process listening on a loopback port."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, num_chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-num_chars:]
        return ""

    def wait_ready(self, path: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise StackError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + path, timeout=2.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise StackError(f"{self.name} not ready within {timeout_s:.0f}s:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self, timeout_s: float = 20.0) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass(frozen=True, slots=True)
class StackConfig:
    num_backends: int = 1
    policy: str = "cache_aware"
    workdir: Path | None = None  # logs, TOML and the gateway's SQLite file; None: a temporary dir
    backend_args: tuple[str, ...] = ()  # extra `edgerun backend` flags, e.g. ("--num-kv-blocks", "512")
    gateway_port: int | None = None  # None: a free port
    log_level: str = "warning"
    ready_timeout_s: float = READY_TIMEOUT_S
    # the gateway's wait for a backend's first byte: generous, since on a small shared CPU a
    # queue of long prefills can take longer than the production default of 30 s
    first_byte_timeout_s: float = 120.0
    threads_per_backend: int | None = None  # None: (cores - 1) // num_backends, at least 1

    def __post_init__(self) -> None:
        if self.num_backends < 1:
            raise ValueError("num_backends must be >= 1")


@dataclass(slots=True)
class Stack:
    gateway: Service
    backends: list[Service]
    admin_token: str
    workdir: Path
    policy: str

    @property
    def url(self) -> str:
        return self.gateway.url


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGERUN_")}
    env["EDGERUN_LOG_JSON"] = "false"
    env.update(extra)
    return env


def spawn(name: str, args: Sequence[str], workdir: Path, port: int, env: dict[str, str]) -> Service:
    log_path = workdir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "gateway.cli", *args], cwd=ROOT, env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
    return Service(name, port, process, log_path)


def gateway_toml(config: StackConfig, workdir: Path, backends: Sequence[Service], admin_token: str) -> str:
    """The gateway's settings file (json.dumps quotes strings the way TOML basic strings want)."""
    lines = [
        f"sqlite_path = {json.dumps(str(workdir / 'gateway.sqlite3'))}",
        f"admin_token = {json.dumps(admin_token)}",
        f"log_level = {json.dumps(config.log_level)}",
        "health_interval_s = 1.0",
        f"backend_first_byte_timeout_s = {config.first_byte_timeout_s}",
        f"backend_read_timeout_s = {max(60.0, config.first_byte_timeout_s)}",
    ]
    for backend in backends:
        lines += ["", "[[backends]]", f"id = {json.dumps(backend.name)}", f"base_url = {json.dumps(backend.url)}",
                  'region = "local"']
    return "\n".join(lines) + "\n"


def start_backends(config: StackConfig, workdir: Path) -> list[Service]:
    threads = config.threads_per_backend or max(1, ((os.cpu_count() or 1) - 1) // config.num_backends)
    env = child_env(OMP_NUM_THREADS=str(threads))
    started = []
    try:
        for i in range(config.num_backends):
            port = free_port()
            args = ["backend", "--model", "smollm2", "--port", str(port), "--region", "local",
                    "--log-level", config.log_level, *config.backend_args]
            started.append(spawn(f"b{i + 1}", args, workdir, port, env))
        with ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(lambda s: s.wait_ready("/health", config.ready_timeout_s), started))
    except BaseException:
        for service in started:
            service.stop()
        raise
    return started


def start_gateway(config: StackConfig, workdir: Path, backends: Sequence[Service], admin_token: str) -> Service:
    toml = workdir / "gateway.toml"
    toml.write_text(gateway_toml(config, workdir, backends, admin_token))
    port = config.gateway_port or free_port()
    env = child_env(EDGERUN_CONFIG=str(toml), EDGERUN_ROUTING_POLICY=config.policy)
    gateway = spawn("gateway", ["serve", "--port", str(port)], workdir, port, env)
    try:
        gateway.wait_ready("/healthz", 60.0)
    except BaseException:
        gateway.stop()
        raise
    return gateway


@contextlib.contextmanager
def running_stack(config: StackConfig) -> Iterator[Stack]:
    """Backends and a gateway, ready; all stopped (gateway first) when the block ends."""
    with contextlib.ExitStack() as cleanup:
        if config.workdir is None:
            workdir = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="edgerun-loadtest-")))
        else:
            workdir = config.workdir
            workdir.mkdir(parents=True, exist_ok=True)
        backends = start_backends(config, workdir)
        for backend in backends:
            cleanup.callback(backend.stop)
        admin_token = secrets.token_urlsafe(24)
        gateway = start_gateway(config, workdir, backends, admin_token)
        cleanup.callback(gateway.stop)
        yield Stack(gateway, backends, admin_token, workdir, config.policy)
