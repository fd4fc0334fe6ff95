"""`RedisTenancy`: tenants, keys and secrets in Redis (keys.py has the layout).

Nothing is cached locally: a key lookup reads Redis (`authenticate`: the key and its tenant in one
script), so a revocation holds on every replica at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Unpack

from gateway.store import apikeys
from gateway.store.checks import check_id
from gateway.store.errors import Conflict, NotFound
from gateway.store.models import ApiKey, KeyOptions, Tenant, TenantOptions, new_key, new_tenant
from gateway.store.redis.connection import RedisConnection, redis_errors
from gateway.store.redis.keys import decode_key, decode_tenant, encode_key, encode_tenant

_SET_IF_ABSENT_THEN_GET = "redis.call('SET', KEYS[1], ARGV[1], 'NX') return redis.call('GET', KEYS[1])"


def _pairs(flat: list[str]) -> dict[str, str]:
    return dict(zip(flat[::2], flat[1::2]))


class RedisTenancy:
    def __init__(self, connection: RedisConnection, clock: Callable[[], float] = time.time) -> None:
        self._c = connection
        self._redis: Any = connection.redis
        self._names = connection.names
        self._clock = clock

    @redis_errors
    async def authenticate(self, secret: str) -> tuple[ApiKey, Tenant] | None:
        presented = apikeys.hash_secret(secret)
        if presented is None:
            return None
        key_fields, tenant_fields = await self._c.script("AUTHENTICATE")(
            keys=[self._names.apikey(presented)], args=[self._names.tenant("")]
        )
        key = self._live_key(_pairs(key_fields), presented)
        if key is None or not tenant_fields:
            return None
        return key, decode_tenant(key.tenant_id, _pairs(tenant_fields))

    @staticmethod
    def _live_key(fields: dict[str, str], presented: str) -> ApiKey | None:
        if not fields or not apikeys.same_hash(fields["hash"], presented):
            return None
        key = decode_key(fields)
        return None if key.is_revoked else key

    # --- tenants ---

    @redis_errors
    async def create_tenant(self, name: str, account_ids: Sequence[str], **options: Unpack[TenantOptions]) -> Tenant:
        tenant = new_tenant(name, account_ids, now=self._clock(), **options)
        n = self._names
        fields = [x for pair in encode_tenant(tenant).items() for x in pair]
        status = await self._c.script("CREATE_TENANT")(
            keys=[n.tenant(tenant.id), n.tenants(), *(n.account(a) for a in tenant.account_ids)],
            args=[tenant.id, *fields],
        )
        if status == -1:
            raise Conflict(f"tenant {tenant.id!r} already exists")
        if status > 0:
            raise Conflict(f"account {tenant.account_ids[status - 1]!r} is already owned by another tenant")
        return tenant

    @redis_errors
    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        fields = await self._redis.hgetall(self._names.tenant(tenant_id))
        return decode_tenant(tenant_id, fields) if fields else None

    @redis_errors
    async def get_tenant_by_account(self, account_id: str) -> Tenant | None:
        tenant_id = await self._redis.get(self._names.account(account_id))
        return None if tenant_id is None else await self.get_tenant(tenant_id)

    @redis_errors
    async def list_tenants(self) -> list[Tenant]:
        ids = sorted(await self._redis.smembers(self._names.tenants()))
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant_id in ids:
                pipe.hgetall(self._names.tenant(tenant_id))
            rows = await pipe.execute()
        tenants = [decode_tenant(i, f) for i, f in zip(ids, rows) if f]
        return sorted(tenants, key=lambda t: (t.created_at, t.id))

    # --- API keys ---

    @redis_errors
    async def create_key(self, tenant_id: str, **options: Unpack[KeyOptions]) -> tuple[ApiKey, str]:
        if not await self._redis.exists(self._names.tenant(tenant_id)):
            raise NotFound(f"tenant {tenant_id!r} does not exist")
        key, secret, key_hash = new_key(tenant_id, now=self._clock(), **options)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._names.apikey(key_hash), mapping=encode_key(key, key_hash))
            pipe.set(self._names.apikey_id(key.id), key_hash)
            pipe.sadd(self._names.tenant_keys(tenant_id), key.id)
            await pipe.execute()
        return key, secret

    @redis_errors
    async def lookup_key(self, secret: str) -> ApiKey | None:
        presented = apikeys.hash_secret(secret)
        if presented is None:
            return None
        return self._live_key(await self._redis.hgetall(self._names.apikey(presented)), presented)

    @redis_errors
    async def get_key(self, key_id: str) -> ApiKey | None:
        key_hash = await self._redis.get(self._names.apikey_id(key_id))
        fields = {} if key_hash is None else await self._redis.hgetall(self._names.apikey(key_hash))
        return decode_key(fields) if fields else None

    @redis_errors
    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        key_ids = sorted(await self._redis.smembers(self._names.tenant_keys(tenant_id)))
        hashes = await self._redis.mget([self._names.apikey_id(k) for k in key_ids]) if key_ids else []
        async with self._redis.pipeline(transaction=False) as pipe:
            for key_hash in hashes:
                if key_hash is not None:
                    pipe.hgetall(self._names.apikey(key_hash))
            rows = await pipe.execute()
        return sorted((decode_key(f) for f in rows if f), key=lambda k: (k.created_at, k.id))

    @redis_errors
    async def revoke_key(self, key_id: str) -> bool:
        key_hash = await self._redis.get(self._names.apikey_id(key_id))
        if key_hash is None:
            return False
        # HSETNX: the first revocation's time stands; the hash exists (keys are never deleted).
        await self._redis.hsetnx(self._names.apikey(key_hash), "revoked_at", repr(self._clock()))
        return True

    # --- server-side secrets ---

    @redis_errors
    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        key = self._names.secret(check_id("secret name", name))
        # one atomic script: set if absent (no TTL: it outlives every replica), then read what won
        return str(await self._redis.eval(_SET_IF_ABSENT_THEN_GET, 1, key, candidate))
