from __future__ import annotations

from pathlib import Path

import pytest

from gateway.settings import GatewaySettings
from gateway.store import StoreUnavailable, open_store
from gateway.store.embedded import EmbeddedStore
from gateway.store.redis_store import RedisStore


async def test_settings_choose_the_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_url: str) -> None:
    monkeypatch.setenv("EDGERUN_SQLITE_PATH", str(tmp_path / "nested" / "gw.sqlite3"))
    monkeypatch.delenv("EDGERUN_REDIS_URL", raising=False)
    embedded = open_store(GatewaySettings().store)
    assert isinstance(embedded, EmbeddedStore) and (tmp_path / "nested" / "gw.sqlite3").exists()
    await embedded.aclose()
    monkeypatch.setenv("EDGERUN_REDIS_URL", redis_url)
    settings = GatewaySettings(key_prefix="edgerun-test-factory:")
    assert settings.store.redis_url == redis_url
    shared = open_store(settings.store)
    assert isinstance(shared, RedisStore)
    assert await shared.get_tenant("nobody") is None
    await shared.aclose()


async def test_unreachable_redis_is_a_typed_error(tmp_path: Path) -> None:
    store = open_store(GatewaySettings(redis_url="redis://127.0.0.1:1/0", redis_timeout_s=0.5).store)
    with pytest.raises(StoreUnavailable, match="EDGERUN_REDIS_URL"):
        await store.lookup_key("edg_" + "0" * 48)
    with pytest.raises(StoreUnavailable):
        await store.check_and_consume("key_a", 1, None, 0, 0.0)
    await store.aclose()


def test_settings_reject_nonsense() -> None:
    with pytest.raises(ValueError):
        GatewaySettings(session_ttl_s=0)
    with pytest.raises(ValueError):
        GatewaySettings(prefix_index_max_entries=0)


async def test_in_memory_sqlite_for_tests() -> None:
    store = open_store(GatewaySettings(redis_url=None, sqlite_path=":memory:").store)
    tenant = await store.create_tenant("Acme", ["acct1"])
    assert await store.get_tenant(tenant.id) == tenant
    await store.aclose()
    await store.aclose()  # closing twice is harmless


async def test_workers_without_redis_or_a_store_host_share_the_sqlite_file(tmp_path: Path) -> None:
    from gateway.store.embedded_shared import SharedEmbeddedStore

    path = str(tmp_path / "gw.sqlite3")
    # a worker the supervisor gave no host (it gives one unless sqlite_shared is chosen), and the choice itself
    for settings in (GatewaySettings(redis_url=None, sqlite_path=path, workers=2, port=8080, worker_index=0),
                     GatewaySettings(redis_url=None, sqlite_path=path, sqlite_shared=True)):
        store = open_store(settings.store)
        assert isinstance(store, SharedEmbeddedStore)
        await store.aclose()
    with pytest.raises(ValueError, match="not ':memory:'"):
        GatewaySettings(redis_url=None, sqlite_path=":memory:", workers=2, port=8080)


async def test_a_store_socket_chooses_the_store_host_unless_redis_is_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, redis_url: str
) -> None:
    from gateway.store.host.client import HostedStore

    monkeypatch.delenv("EDGERUN_REDIS_URL", raising=False)
    monkeypatch.setenv("EDGERUN_STORE_SOCKET", str(tmp_path / "store.sock"))
    monkeypatch.setenv("EDGERUN_SQLITE_PATH", str(tmp_path / "gw.sqlite3"))
    settings = GatewaySettings()
    assert settings.store.store_socket == str(tmp_path / "store.sock")
    hosted = open_store(settings.store)
    assert isinstance(hosted, HostedStore) and not (tmp_path / "gw.sqlite3").exists()  # the host owns the file
    with pytest.raises(StoreUnavailable, match="store host"):  # no host is running there
        await hosted.get_tenant("nobody")
    await hosted.aclose()
    redis = open_store(GatewaySettings(redis_url=redis_url, key_prefix="edgerun-test-factory:").store)
    assert isinstance(redis, RedisStore)
    await redis.aclose()
