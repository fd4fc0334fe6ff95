"""Every store test runs three times: on the embedded store (a temporary SQLite file), on the
embedded store shared by processes (the same file, `sqlite_shared`) and on Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.settings import GatewaySettings
from gateway.store import Store, open_store

OpenStore = Callable[..., Store]


@pytest.fixture(params=["embedded", "shared", "redis"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
async def open_instance(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Opens store instances over the same state (same SQLite file, or same Redis namespace)."""
    redis_url = request.getfixturevalue("redis_url") if kind == "redis" else None
    prefix = request.getfixturevalue("redis_prefix") if kind == "redis" else "unused:"
    opened: list[Store] = []

    def open_(**overrides: Any) -> Store:
        settings = GatewaySettings(
            redis_url=redis_url, sqlite_path=str(tmp_path / "gateway.sqlite3"), key_prefix=prefix,
            sqlite_shared=kind == "shared", **overrides
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
    """Two gateway replicas' views of one state. The embedded store is one process, so it is one instance."""
    first = open_instance()
    return (first, first) if kind == "embedded" else (first, open_instance())
