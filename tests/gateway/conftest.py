"""Fixtures shared by the gateway's tests: a real Redis.

`redis_url` is a Redis at 127.0.0.1:6379 when one answers, else a `redis-server` from PATH
started on a free port for the session. With neither, tests that need Redis are skipped, or
fail when CI=true (CI must exercise the Redis store). `redis_prefix` gives each test its own key
namespace and deletes it afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from loadtests.processes import free_port


def _answers(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if _answers("redis://127.0.0.1:6379/0"):
        yield "redis://127.0.0.1:6379/0"
        return
    binary = shutil.which("redis-server")
    if binary is None:
        message = "no Redis at 127.0.0.1:6379 and no redis-server on PATH"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (CI=true: the Redis store must be tested)")
        pytest.skip(message)
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    workdir = tmp_path_factory.mktemp("redis")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not _answers(url):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"redis-server on port {port} did not start (exit code {process.poll()})")
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    prefix = f"edgerun-test:{uuid.uuid4().hex[:12]}:"
    yield prefix
    with redis.Redis.from_url(redis_url) as client:
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)


# --- gateway end-to-end fixtures (real backend processes + gateway; see fixtures_e2e.py) ---
from tests.gateway.fixtures_e2e import backend_pair, gateway  # noqa: E402,F401
