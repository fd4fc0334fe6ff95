"""The shipped Redis set-up (infra/redis/redis.conf + the ACL user in infra/compose.yaml) lets the
gateway do all its work as `edgerun` and nothing else: no anonymous access, no other keys, no
admin commands. Runs a redis-server of its own, as compose starts it."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml

from cli.processes import ROOT
from gateway.settings import GatewaySettings
from gateway.store.redis_store import RedisStore
from tests.gateway.redis_server import start_redis
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
        redis_url=f"redis://edgerun:{password}@127.0.0.1:{port}/0", ledger_archive_path=str(tmp_path / "a.sqlite3")
    )
    store = RedisStore(settings.store)
    try:
        tenant = await store.create_tenant("Acme", ["acc"], tenant_id="acme", max_concurrent_requests=2)
        key, secret = await store.create_key(tenant.id, rpm=10, tpm=1000)
        assert (await store.lookup_key(secret)) == key and await store.list_keys(tenant.id)
        assert [t.id for t in await store.list_tenants()] == ["acme"]
        assert (await store.check_and_consume(key.id, 10, 1000, 50)).allowed
        await store.reconcile_tokens(key.id, 50, 20)
        assert (await store.reserve_budget(tenant.id, "2027-01", 100, 1000)).allowed
        await store.settle_budget(tenant.id, "2027-01", 100, 40)
        await store.set_session(tenant.id, "s1", "b1")
        assert await store.get_session(tenant.id, "s1") == "b1"
        await store.record_prefix("b1", [1, 2, 3])
        assert await store.match_prefix([1, 2, 3]) == {"b1": 3}
        await store.remove_prefix("b1", [3])
        await store.add_inflight("b1", 10, 2)
        await store.correct_inflight("b1", 5, 1)
        assert await store.loads() == {"b1": (5, 1)}
        await store.release_inflight("b1", 5, 1)
        assert await store.acquire_request_slot(tenant.id, "r1", 2)
        await store.release_request_slot(tenant.id, "r1")
        first = record("req-1", T0, tenant_id="acme")
        assert await store.append_usage(first) and await store.get_usage("req-1") == first
        assert await store.archive_ledger(T0 + 1) == 1
        assert await collect(store, T0 - 1, T0 + 1) == [first]
        assert await store.revoke_key(key.id) and await store.lookup_key(secret) is None
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
