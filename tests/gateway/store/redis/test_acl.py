"""The shipped Redis set-up (infra/redis/redis.conf + the ACL user in infra/compose.yaml) lets the
gateway do all its work as `edgerun` and nothing else: no anonymous access, no other keys, no
admin commands. Runs a redis-server of its own, as compose starts it."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

from cli.processes import ROOT
from gateway.settings import GatewaySettings
from gateway.store import open_store
from gateway.store.adapters import new_finetune
from tests.gateway.redis_server import start_redis
from tests.gateway.store.calls import (
    acquire_request_slot,
    add_inflight,
    get_session,
    match_prefix,
    reconcile_tokens,
    release_inflight,
    release_request_slot,
    reserve_budget,
    set_session,
    settle_budget,
)
from tests.gateway.store.test_ledger import T0, collect, record

pytestmark = pytest.mark.process

INFRA = ROOT / "infra"


@pytest.fixture(scope="module")
def shipped_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    password = secrets.token_hex(16)
    command = yaml.safe_load((INFRA / "compose.yaml").read_text())["services"]["redis"]["command"]
    assert command[:2] == ["redis-server", "/usr/local/etc/redis/redis.conf"]
    args = [a.replace("${EDGERUN_REDIS_PASSWORD:?set a Redis password}", password) for a in command[2:]]
    server = start_redis(
        tmp_path_factory.mktemp("redis-acl"), args, config_file=INFRA / "redis" / "redis.conf",
        username="edgerun", password=password,
    )
    try:
        yield server.port, password
    finally:
        server.stop(timeout_s=10)


async def test_the_gateway_does_all_its_work_as_the_acl_user(shipped_redis: tuple[int, str], tmp_path: Path) -> None:
    port, password = shipped_redis
    settings = GatewaySettings(
        redis_url=f"redis://edgerun:{password}@127.0.0.1:{port}/0", ledger_archive_path=str(tmp_path / "a.sqlite3"),
        cache_max_bytes=2500,
    )
    store = open_store(settings.store)
    try:
        tenant = await store.tenancy.create_tenant("Acme", ["acc"], tenant_id="acme", max_concurrent_requests=2)
        key, secret = await store.tenancy.create_key(tenant.id, rpm=10, tpm=1000)
        assert (await store.tenancy.lookup_key(secret)) == key and await store.tenancy.list_keys(tenant.id)
        assert [t.id for t in await store.tenancy.list_tenants()] == ["acme"]
        assert (await store.admission.check_and_consume(key.id, 10, 1000, 50)).allowed
        await reconcile_tokens(store, key.id, 50, 20)
        assert (await reserve_budget(store, tenant.id, "2027-01", 100, 1000)).allowed
        await settle_budget(store, tenant.id, "2027-01", 100, 40)
        await set_session(store, tenant.id, "s1", "b1")
        assert await get_session(store, tenant.id, "s1") == "b1"
        await store.routing.record_prefix("b1", [1, 2, 3])
        assert await match_prefix(store, [1, 2, 3]) == {"b1": 3}
        await store.routing.remove_prefix("b1", [3])
        await add_inflight(store, "b1", 10, 2)
        await store.routing.correct_inflight("b1", 5, 1)
        assert await store.routing.loads() == {"b1": (5, 1)}
        await release_inflight(store, "b1", 5, 1)
        assert await acquire_request_slot(store, tenant.id, "r1", 2)
        await release_request_slot(store, tenant.id, "r1")
        first = record("req-1", T0, tenant_id="acme")
        assert await store.ledger.append(first) and await store.ledger.get("req-1") == first
        assert await store.ledger.archive(T0 + 1) == 1
        assert await collect(store, T0 - 1, T0 + 1) == [first]
        assert await store.tenancy.revoke_key(key.id) and await store.tenancy.lookup_key(secret) is None
        finetune = new_finetune("acc", "french", "@cf/m/m")
        await store.adapters.create_finetune(finetune, 100)
        assert (await store.adapters.add_asset("acc", finetune.id, "adapter_config.json")).assets
        assert [f.id for f in await store.adapters.list_finetunes("acc")] == [finetune.id]
        assert await store.adapters.get_finetune("acc", "french") is not None
        assert await store.adapters.delete_finetune("acc", finetune.id)
        assert await store.cache.put(tenant.id, "k1", "answer", 0.05) and await store.cache.get(tenant.id, "k1")
        await asyncio.sleep(0.1)
        assert await store.cache.put(tenant.id, "k1", "again", 60)  # forgets the expired entry on the way
        for i in range(2, 5):  # past cache_max_bytes: the nearest expiry goes
            assert await store.cache.put(tenant.id, f"k{i}", "x" * 700, 60 + i)
        assert await store.cache.get(tenant.id, "k1") is None and await store.cache.get(tenant.id, "k4")
    finally:
        await store.aclose()


def test_nothing_else_is_allowed(shipped_redis: tuple[int, str]) -> None:
    port, password = shipped_redis
    with redis.Redis(port=port) as anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.ping()  # `default` is off
    with redis.Redis(port=port, username="edgerun", password=password) as client:
        for forbidden in (lambda: client.get("other:key"), lambda: client.keys("*"), client.flushall,
                          lambda: client.config_get("*"), lambda: client.eval("return redis.call('FLUSHALL')", 0)):
            with pytest.raises(redis.exceptions.ResponseError, match="(?i)permission|can't run"):
                forbidden()
