"""A local store on a temporary SQLite file, for the gateway's service tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.settings import GatewaySettings
from gateway.store import Store, open_store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = open_store(GatewaySettings(redis_url=None, sqlite_path=str(tmp_path / "gateway.sqlite3")).store)
    yield opened
    await opened.aclose()
