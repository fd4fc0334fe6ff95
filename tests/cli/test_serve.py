"""A lone `edgerun serve` on the one-process store claims its SQLite file while it serves
(gateway/store/local/file_claim.py): two processes keeping that store on one file would each grant
every limit and write the month's spend over the other's. Whichever starts first, the second
(`serve --workers 2`, whose workers share the file, or another lone serve) is refused with exit
status 1 and says why; the claim ends with the process that held it. Real processes; the gateways
serve the default fleet (no backend is reached)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli.processes import ROOT, child_env, free_port
from tests.gateway.fixtures_e2e import GatewayProcess, start_gateway_process

pytestmark = pytest.mark.slow
REFUSED = "another process serves"


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        "EDGERUN_SQLITE_PATH": str(tmp_path / "data" / "gateway.sqlite3"),  # a directory made on first use
        "EDGERUN_TOKENIZER_CACHE_DIR": str(tmp_path / "tokenizers"),
        "EDGERUN_LOG_LEVEL": "warning",
    }


def _lone_serve(env: dict[str, str]) -> GatewayProcess:
    gateway = start_gateway_process(env)
    gateway.wait_ready()
    return gateway


def _serve(*flags: str) -> list[str]:
    return [sys.executable, "-m", "cli", "serve", "--port", str(free_port()), *flags]


def _refused(argv: list[str], env: dict[str, str]) -> str:
    """The output of `argv`, which must exit with status 1 before it serves (a refusal takes a few
    seconds: imports and settings; one that serves instead runs until killed)."""
    try:
        done = subprocess.run(
            argv, cwd=ROOT, env=child_env(env, keep_edgerun=False, threads=None),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{argv[3]} was not refused: it ran for {exc.timeout:g} s")
    assert done.returncode == 1, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_lone_serve_beside_serve_workers_is_refused(tmp_path: Path) -> None:
    env = _env(tmp_path)
    workers = start_gateway_process({**env, "EDGERUN_WORKERS": "2"})  # its workers share the file
    try:
        workers.wait_ready()
        said = _refused(_serve(), env)
        assert REFUSED in said and f"edgerun serve on port {workers.port}, shared mode" in said
    finally:
        workers.stop()


def test_serve_workers_beside_a_lone_serve_is_refused(tmp_path: Path) -> None:
    env = _env(tmp_path)
    gateway = _lone_serve(env)
    try:
        # each worker is refused at its start: the supervisor stops there, with that status
        said = _refused(_serve("--workers", "2"), env)
        assert REFUSED in said and f"edgerun serve on port {gateway.port}, pid {gateway.process.pid}" in said
        assert gateway.process.poll() is None  # the first serves on
    finally:
        gateway.stop()


def test_two_lone_serves_on_one_file_one_at_a_time(tmp_path: Path) -> None:
    env = _env(tmp_path)
    first = _lone_serve(env)
    try:
        said = _refused(_serve(), env)
        assert REFUSED in said and f"pid {first.process.pid}" in said
    finally:
        first.stop()
    assert first.process.returncode == 0
    second = _lone_serve(env)  # the first's claim ended with it
    second.stop()
    assert second.process.returncode == 0


def test_serves_in_the_shared_mode_share_the_file_but_never_with_a_lone_serve(tmp_path: Path) -> None:
    """The shared mode is for several serves on one file (each limit checked in the file), never beside
    a process that keeps the store alone, whichever came first; `:memory:` is nobody else's."""
    shared = {**_env(tmp_path), "EDGERUN_SQLITE_SHARED": "true"}
    memory = {**_env(tmp_path), "EDGERUN_SQLITE_PATH": ":memory:"}
    gateways = [start_gateway_process(env) for env in (shared, shared, memory, memory)]
    try:
        for gateway in gateways:
            gateway.wait_ready()
        said = _refused(_serve(), _env(tmp_path))
        assert REFUSED in said and "shared mode" in said
    finally:
        for gateway in gateways:
            gateway.stop()
    assert [g.process.returncode for g in gateways] == [0, 0, 0, 0]
    lone = _lone_serve(_env(tmp_path))  # the shared serves' claims ended with them
    try:
        said = _refused(_serve(), shared)
        assert REFUSED in said and f"edgerun serve on port {lone.port}, pid {lone.process.pid}" in said
    finally:
        lone.stop()
    assert not (tmp_path / ":memory:.host-lock").exists()


def test_edgerun_dev_beside_a_lone_serve_is_refused_before_it_starts_a_backend(tmp_path: Path) -> None:
    """`edgerun dev` (`make run`) keeps the store in its own process too: it claims the file first."""
    env = _env(tmp_path)
    gateway = _lone_serve(env)
    try:
        argv = [sys.executable, "-m", "cli", "dev", "--port", str(free_port()), "--admin-port", str(free_port()),
                "--sqlite-path", env["EDGERUN_SQLITE_PATH"], "--no-embeddings"]
        said = _refused(argv, env)
        assert REFUSED in said and f"edgerun serve on port {gateway.port}, pid {gateway.process.pid}" in said
        assert "starting the backend" not in said  # refused before anything started
        assert gateway.process.poll() is None
    finally:
        gateway.stop()
