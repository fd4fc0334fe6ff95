"""`ReplicatedTenancy`: tenancy read from this region's replica of the home region's tenancy Redis,
written at home.

Every read a request makes (`authenticate`) goes to the region's own read-only Redis replica
(`tenancy_replica_url`, a `REPLICAOF` of `home_tenancy_url`), so no key lookup crosses the WAN;
Redis replication brings every write there, a revocation or a new key within the link's one-way
delay plus Redis's propagation (measured in BENCHMARKS.md, "Several regions"). Writes (tenants,
keys, revocations: the admin API and the CLI) go to the home region's tenancy Redis, so the home
region holds the one record; a write is seen by a read in this region once it has replicated.
A replica that restarts resyncs from home on its own (Redis's replication), and until it has, its
lookups find nothing (requests get 401) rather than stale keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Unpack

from redis.exceptions import RedisError

from gateway.store.checks import check_id
from gateway.store.models import ApiKey, KeyOptions, Tenant, TenantOptions
from gateway.store.redis.connection import RedisConnection, redis_errors
from gateway.store.redis.tenancy import RedisTenancy


class ReplicatedTenancy:
    def __init__(self, replica: RedisConnection, home: RedisConnection) -> None:
        self._replica_connection = replica
        self._read = RedisTenancy(replica)
        self._write = RedisTenancy(home)

    async def replica_link(self) -> str:
        """The tenancy copy's link to home: "up", "down" (serving what it had; Redis's
        master_link_down_since_seconds says since when), "home" (it is home's own), or "unreachable"."""
        try:
            info = await self._replica_connection.redis.info("replication")
        except (RedisError, OSError):
            return "unreachable"
        if info.get("role") == "master":
            return "home"
        return "up" if info.get("master_link_status") == "up" else "down"

    # --- reads: this region's replica ---

    async def authenticate(self, secret: str) -> tuple[ApiKey, Tenant] | None:
        return await self._read.authenticate(secret)

    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        return await self._read.get_tenant(tenant_id)

    async def get_tenant_by_account(self, account_id: str) -> Tenant | None:
        return await self._read.get_tenant_by_account(account_id)

    async def list_tenants(self) -> list[Tenant]:
        return await self._read.list_tenants()

    async def lookup_key(self, secret: str) -> ApiKey | None:
        return await self._read.lookup_key(secret)

    async def get_key(self, key_id: str) -> ApiKey | None:
        return await self._read.get_key(key_id)

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        return await self._read.list_keys(tenant_id)

    # --- writes: home ---

    async def create_tenant(self, name: str, account_ids: Sequence[str], **options: Unpack[TenantOptions]) -> Tenant:
        return await self._write.create_tenant(name, account_ids, **options)

    async def create_key(self, tenant_id: str, **options: Unpack[KeyOptions]) -> tuple[ApiKey, str]:
        return await self._write.create_key(tenant_id, **options)

    async def revoke_key(self, key_id: str) -> bool:
        return await self._write.revoke_key(key_id)

    @redis_errors
    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        """Read here once it has replicated; the first gateway anywhere creates it at home."""
        c = self._replica_connection
        found = await c.redis.get(c.names.secret(check_id("secret name", name)))
        return str(found) if found is not None else await self._write.get_or_create_secret(name, candidate)
