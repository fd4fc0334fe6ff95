"""The shipped two-region set-up (infra/compose.regions.yaml, infra/redis/redis.conf) lets a region's
gateway do its work as the ACL user `edgerun`, and its tenancy replica replicate as `replica`: four
redis-servers started with the compose file's own arguments."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli.processes import ROOT
from gateway.settings import GatewaySettings
from gateway.store import Claim, Release, open_store
from tests.gateway.redis_server import start_redis
from tests.gateway.store.test_ledger import record

pytestmark = pytest.mark.process

INFRA = ROOT / "infra"


def _command(service: str, password: str, **hosts: int) -> list[str]:
    command: list[str] = yaml.safe_load((INFRA / "compose.regions.yaml").read_text())["services"][service]["command"]
    assert command[:2] == ["redis-server", "/usr/local/etc/redis/redis.conf"]
    args = [a.replace("${EDGERUN_REDIS_PASSWORD:?set a Redis password}", password) for a in command[2:]]
    return [str(hosts[a]) if a in hosts else a for a in args]


async def test_a_region_works_as_the_acl_users_of_the_compose_example(tmp_path: Path) -> None:
    password = secrets.token_hex(16)
    login: dict[str, Any] = {"username": "edgerun", "password": password}
    config = INFRA / "redis" / "redis.conf"
    for name in ("redis-home", "redis-tenancy", "redis-region-2", "replica"):
        (tmp_path / name).mkdir()
    servers = {name: start_redis(tmp_path / name, _command(name, password), config_file=config, **login)
               for name in ("redis-home", "redis-tenancy", "redis-region-2")}  # fmt: skip
    replica_args = _command("redis-region-2-tenancy", password)
    at = replica_args.index("--replicaof")
    replica_args[at + 1: at + 3] = ["127.0.0.1", str(servers["redis-tenancy"].port)]
    servers["replica"] = start_redis(tmp_path / "replica", replica_args, config_file=config, **login)

    def url(name: str) -> str:
        return f"redis://edgerun:{password}@127.0.0.1:{servers[name].port}/0"

    settings = GatewaySettings(
        redis_url=url("redis-region-2"), home_redis_url=url("redis-home"), home_tenancy_url=url("redis-tenancy"),
        tenancy_replica_url=url("replica"), region="region-2",
    )
    store = open_store(settings.store)
    loops = [asyncio.create_task(loop()) for loop in store.background]
    try:
        tenant = await store.tenancy.create_tenant("Acme", ["acc"], tenant_id="acme", monthly_budget_micro=10_000)
        _, secret = await store.tenancy.create_key(tenant.id)
        for _ in range(300):  # replicated to the region's replica (a full sync first)
            if await store.tenancy.authenticate(secret) is not None:
                break
            await asyncio.sleep(0.05)
        assert await store.tenancy.authenticate(secret) is not None
        claim = Claim("acme", "req-1", month="2027-01", amount_micro=100, budget_micro=10_000)
        assert (await store.admission.admit(claim)).allowed  # a lease taken at home
        done = record("req-1", 1_800_000_000.0, tenant_id="acme")
        release = Release("acme", "req-1", month="2027-01", reserved_micro=100, cost_micro=done.cost_micro)
        assert await store.admission.settle(release, done)
        for _ in range(300):  # shipped home
            if await store.ledger.get("req-1") == done:
                break
            await asyncio.sleep(0.05)
        assert await store.ledger.get("req-1") == done
    finally:
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        await store.aclose()
        for server in servers.values():
            server.stop(timeout_s=10)
