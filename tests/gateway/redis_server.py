"""A private redis-server for the tests that need their own (a configuration, a restart, a full
memory): started through cli/processes.py and ready once it answers PING."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

from cli.processes import ChildProcess, free_port

EPHEMERAL = ("--save", "", "--appendonly", "no")  # nothing written to disk


def redis_binary(missing: str = "redis-server is not installed") -> str:
    """redis-server's path. Without one the test is skipped, or fails under CI=true (CI must test Redis)."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{missing} (CI=true: `make test` installs redis-server)")
        pytest.skip(missing)
    return binary


def answers(url: str, **client_options: Any) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5, **client_options) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def start_redis(
    workdir: Path,
    options: Sequence[str] = EPHEMERAL,
    *,
    config_file: Path | None = None,
    port: int | None = None,
    **client_options: Any,
) -> ChildProcess:
    """redis-server on 127.0.0.1 with its files in `workdir`; `client_options` (username, password)
    are what PING needs to prove it ready."""
    port = port or free_port()
    config = [str(config_file)] if config_file is not None else []
    argv = [redis_binary(), *config, *options, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir)]
    server = ChildProcess.launch("redis-server", argv, port)
    try:
        server.wait_until_ready(lambda: answers(f"redis://127.0.0.1:{port}/0", **client_options), timeout_s=10, interval_s=0.05)
    except BaseException:
        server.stop(timeout_s=10)
        raise
    return server


def new_prefix() -> str:
    """A key namespace of its own for one test (or one module's tests) on a shared Redis."""
    return f"edgerun-test:{uuid.uuid4().hex[:12]}:"


def delete_prefix(url: str, prefix: str) -> None:
    """Delete every key under `prefix`."""
    with redis.Redis.from_url(url) as client:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)
