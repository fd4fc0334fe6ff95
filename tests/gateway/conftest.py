"""Fixtures shared by the gateway's tests: a real Redis.

`redis_url` is a Redis at 127.0.0.1:6379 when one answers, else a `redis-server` from PATH
started on a free port for the session. With neither, tests that need Redis are skipped, or
fail when CI=true (CI must exercise the Redis store). `redis_prefix` gives each test its own key
namespace and deletes it afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.redis_server import answers, delete_prefix, new_prefix, redis_binary, start_redis


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if answers("redis://127.0.0.1:6379/0"):
        yield "redis://127.0.0.1:6379/0"
        return
    redis_binary("no Redis at 127.0.0.1:6379 and no redis-server on PATH")
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop(timeout_s=10)


@pytest.fixture
def redis_prefix(redis_url: str) -> Iterator[str]:
    prefix = new_prefix()
    yield prefix
    delete_prefix(redis_url, prefix)

