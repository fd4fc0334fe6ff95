from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import GatewaySettings
from gateway.store import StoreUnavailable, open_store
from gateway.store.local.admission import MemoryAdmission
from gateway.store.local.shared import SharedAdmission
from gateway.store.local.tenancy import LocalTenancy
from gateway.store.redis.admission import RedisAdmission
from gateway.store.redis.tenancy import RedisTenancy


async def test_settings_choose_the_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_url: str) -> None:
    monkeypatch.setenv("EDGERUN_SQLITE_PATH", str(tmp_path / "nested" / "gw.sqlite3"))
    monkeypatch.delenv("EDGERUN_REDIS_URL", raising=False)
    local = open_store(GatewaySettings().store)
    assert isinstance(local.admission, MemoryAdmission) and isinstance(local.tenancy, LocalTenancy)
    assert (tmp_path / "nested" / "gw.sqlite3").exists()
    await local.aclose()
    monkeypatch.setenv("EDGERUN_REDIS_URL", redis_url)
    settings = GatewaySettings(key_prefix="edgerun-test-factory:")
    assert settings.store.redis_url == redis_url
    shared = open_store(settings.store)
    assert isinstance(shared.admission, RedisAdmission) and isinstance(shared.tenancy, RedisTenancy)
    assert await shared.tenancy.get_tenant("nobody") is None
    await shared.aclose()


async def test_unreachable_redis_is_a_typed_error(tmp_path: Path) -> None:
    store = open_store(GatewaySettings(redis_url="redis://127.0.0.1:1/0", redis_timeout_s=0.5).store)
    with pytest.raises(StoreUnavailable, match="EDGERUN_REDIS_URL"):
        await store.tenancy.lookup_key("edg_" + "0" * 48)
    with pytest.raises(StoreUnavailable):
        await store.admission.check_and_consume("key_a", 1, None, 0, 0.0)
    await store.aclose()


def test_settings_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        GatewaySettings(session_ttl_s=0)
    with pytest.raises(ValueError):
        GatewaySettings(prefix_index_max_entries=0)


async def test_in_memory_sqlite_for_tests() -> None:
    store = open_store(GatewaySettings(redis_url=None, sqlite_path=":memory:").store)
    tenant = await store.tenancy.create_tenant("Acme", ["acct1"])
    assert await store.tenancy.get_tenant(tenant.id) == tenant
    await store.aclose()
    await store.aclose()  # closing twice is harmless


async def test_workers_without_redis_share_the_sqlite_file(tmp_path: Path) -> None:
    path = str(tmp_path / "gw.sqlite3")
    # a worker of `serve --workers N`, and the choice itself
    for settings in (GatewaySettings(redis_url=None, sqlite_path=path, workers=2, port=8080, worker_index=0),
                     GatewaySettings(redis_url=None, sqlite_path=path, sqlite_shared=True)):
        store = open_store(settings.store)
        assert isinstance(store.admission, SharedAdmission)
        await store.aclose()
    with pytest.raises(ValueError, match="not ':memory:'"):
        GatewaySettings(redis_url=None, sqlite_path=":memory:", workers=2, port=8080)
