"""Every store test runs once per backend of its concern: the local store (a temporary SQLite file)
and Redis; admission and routing state also in the local store's shared mode (the same file shared
by processes, `sqlite_shared`), their third backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import GatewaySettings
from gateway.store import Store, open_store
from gateway.store.local.shared import SharedRouting

OpenStore = Callable[..., Store]
REDIS = pytest.param("redis", marks=pytest.mark.process)  # may start a server
BACKENDS = ["local", REDIS]
SHARED_BACKENDS = ["local", "shared", REDIS]  # admission and routing state: memory, the shared file, Redis


@pytest.fixture(params=BACKENDS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def open_instance(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Opens store instances over the same state (same SQLite file or Redis namespace)."""
    redis_url = request.getfixturevalue("redis_url") if kind == "redis" else None
    prefix = request.getfixturevalue("redis_prefix") if kind == "redis" else "unused:"
    opened: list[Store] = []

    def open_(**overrides: Any) -> Store:
        settings = GatewaySettings(
            redis_url=redis_url, sqlite_path=str(tmp_path / "gateway.sqlite3"), key_prefix=prefix,
            sqlite_shared=kind == "shared", **overrides,
        )
        store = open_store(settings.store)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        await store.aclose()


@pytest.fixture
def store(open_instance: OpenStore) -> Store:
    return open_instance()


@pytest.fixture
def pair(kind: str, open_instance: OpenStore) -> tuple[Store, Store]:
    """Two gateway replicas' views of one state. The local store is one process, so it is one instance."""
    first = open_instance()
    return (first, first) if kind == "local" else (first, open_instance())


def crash(store: Store) -> None:
    """Stop renewing the replica's lease, as a crashed process does (no renewals, no clean close)."""
    routing: Any = store.routing
    lease = routing._lease._task if isinstance(routing, SharedRouting) else routing._c._lease  # the LeaseTask
    lease._task.cancel()
