"""Start real backends and a gateway on loopback for a load test, and stop them afterwards.

`running_stack(StackConfig(...))` spawns N `edgerun backend --model smollm2` processes and
one `edgerun serve` whose settings come from a generated TOML file (`EDGERUN_CONFIG`) listing
those backends, with an admin token for provisioning tenants. The routing policy is given to the
gateway as `EDGERUN_ROUTING_POLICY`, as an operator would. Inherited `EDGERUN_*` variables are
dropped so the stack does not pick up the caller's settings. Each process logs to a file in the
work directory; a process that dies before it is ready fails the start with its log's tail.

Backends run with `OMP_NUM_THREADS` = (cores - 1) / backends, at least 1, leaving a core to the
gateway and the load generator (processes.threads_per_backend): on a small shared machine,
oversubscribed OpenMP threads spin against each other (on a busy 2-core machine one thread per
backend answered 5x sooner than two). The processes themselves are started and stopped by
cli/processes.py.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import tempfile
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from cli.processes import ChildProcess, threads_per_backend

READY_TIMEOUT_S = 300.0  # a first start converts the GGUF weights once
STOP_TIMEOUT_S = 20.0  # SIGTERM's grace before SIGKILL


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
    gateway: ChildProcess
    backends: list[ChildProcess]
    admin_token: str
    workdir: Path
    policy: str

    @property
    def url(self) -> str:
        return self.gateway.url


def gateway_toml(config: StackConfig, workdir: Path, backends: Sequence[ChildProcess], admin_token: str) -> str:
    """The gateway's settings file (json.dumps quotes strings the way TOML basic strings want)."""
    lines = [
        f"sqlite_path = {json.dumps(str(workdir / 'gateway.sqlite3'))}",
        f"admin_token = {json.dumps(admin_token)}",
        f"log_level = {json.dumps(config.log_level)}",
        "metrics_public = true",  # a local bench stack on loopback: the bench scrapes /metrics
        "health_interval_s = 1.0",
        f"backend_first_byte_timeout_s = {config.first_byte_timeout_s}",
        f"backend_read_timeout_s = {max(60.0, config.first_byte_timeout_s)}",
    ]
    for backend in backends:
        lines += ["", "[[backends]]", f"id = {json.dumps(backend.name)}", f"base_url = {json.dumps(backend.url)}",
                  'region = "local"']
    return "\n".join(lines) + "\n"


def spawn(name: str, command: str, args: Sequence[str], workdir: Path, port: int | None = None,
          threads: int | None = None, **env: str) -> ChildProcess:
    """A child logging to `<workdir>/<name>.log`, without the caller's EDGERUN_* variables."""
    return ChildProcess.spawn(name, command, args, port=port, log_path=workdir / f"{name}.log",
                              env={"EDGERUN_LOG_JSON": "false", **env}, threads=threads)


def start_backends(config: StackConfig, workdir: Path) -> list[ChildProcess]:
    threads = config.threads_per_backend or threads_per_backend(config.num_backends)
    args = ["--model", "smollm2", "--region", "local", "--log-level", config.log_level, *config.backend_args]
    started: list[ChildProcess] = []
    try:
        for i in range(config.num_backends):
            started.append(spawn(f"b{i + 1}", "backend", args, workdir, threads=threads))
        with ThreadPoolExecutor(len(started)) as pool:
            list(pool.map(lambda s: s.wait_ready("/health", config.ready_timeout_s), started))
    except BaseException:
        for service in started:
            service.stop(STOP_TIMEOUT_S)
        raise
    return started


def start_gateway(
    config: StackConfig, workdir: Path, backends: Sequence[ChildProcess], admin_token: str
) -> ChildProcess:
    toml = workdir / "gateway.toml"
    toml.write_text(gateway_toml(config, workdir, backends, admin_token))
    gateway = spawn("gateway", "serve", [], workdir, config.gateway_port,
                    EDGERUN_CONFIG=str(toml), EDGERUN_ROUTING_POLICY=config.policy)
    try:
        gateway.wait_ready("/healthz", 60.0)
    except BaseException:
        gateway.stop(STOP_TIMEOUT_S)
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
            cleanup.callback(backend.stop, STOP_TIMEOUT_S)
        admin_token = secrets.token_urlsafe(32)
        gateway = start_gateway(config, workdir, backends, admin_token)
        cleanup.callback(gateway.stop, STOP_TIMEOUT_S)
        yield Stack(gateway, backends, admin_token, workdir, config.policy)
