"""Every store test runs four times: on the embedded store (a temporary SQLite file), on the
embedded store shared by processes (the same file, `sqlite_shared`), on Redis, and on the store
host (an in-process host on a temporary socket; each instance a worker's connection to it:
tests/gateway/store/test_host_process.py runs the host as its own process)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import GatewaySettings
from gateway.store import Store, open_store
from gateway.store.embedded import EmbeddedStore
from gateway.store.host.server import StoreHost

OpenStore = Callable[..., Store]


@pytest.fixture(params=["embedded", "shared", pytest.param("redis", marks=pytest.mark.process), "hosted"])  # redis: may start a server
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def open_instance(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Opens store instances over the same state (same SQLite file, Redis namespace or store host).

    The store host starts with the first instance's settings; later instances must not ask for others."""
    redis_url = request.getfixturevalue("redis_url") if kind == "redis" else None
    prefix = request.getfixturevalue("redis_prefix") if kind == "redis" else "unused:"
    socket = str(tmp_path / "host" / "store.sock") if kind == "hosted" else None
    opened: list[Store] = []
    hosts: list[tuple[StoreHost, dict[str, Any]]] = []
    host_tasks: list[asyncio.Task[None]] = []
    loop = asyncio.get_running_loop()  # sync fixtures open instances too: the host starts on the tests' loop

    def open_(**overrides: Any) -> Store:
        settings = GatewaySettings(
            redis_url=redis_url,
            sqlite_path=str(tmp_path / "gateway.sqlite3"),
            key_prefix=prefix,
            sqlite_shared=kind == "shared",
            store_socket=socket,
            **overrides,
        )
        if socket is not None:
            if not hosts:
                host = StoreHost(EmbeddedStore(settings.store), socket)
                host.bind()  # connections wait in the backlog until the host accepts them
                started = loop.create_task(host.start())
                hosts.append((host, overrides))
                host_tasks.append(started)
            assert hosts[0][1] == overrides, "every instance of a hosted store shares the first one's host settings"
        store = open_store(settings.store)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        await store.aclose()
    for task in host_tasks:
        await task
    for host, _ in hosts:
        await host.close()


@pytest.fixture
def store(open_instance: OpenStore) -> Store:
    return open_instance()


@pytest.fixture
def pair(kind: str, open_instance: OpenStore) -> tuple[Store, Store]:
    """Two gateway replicas' views of one state. The embedded store is one process, so it is one instance."""
    first = open_instance()
    return (first, first) if kind == "embedded" else (first, open_instance())
