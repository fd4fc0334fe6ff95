"""Tenancy: who may call the gateway. Tenants, their API keys (kept as hashes), revocation, and the
server-side secrets the gateway derives per-tenant values from.

Two implementations pass the same tests: `local.tenancy.LocalTenancy` (the SQLite file, cached in
memory) and `redis.tenancy.RedisTenancy`. Tenants are only ever added, never changed or deleted; a
key is only ever added or revoked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, Unpack

from gateway.store.models import ApiKey, KeyOptions, Tenant, TenantOptions


class Tenancy(Protocol):
    async def authenticate(self, secret: str) -> tuple[ApiKey, Tenant] | None:
        """The live key a presented secret belongs to and its tenant, in one call; None if the secret is
        unknown or revoked. What a request needs to know who is calling (`lookup_key`, then the tenant)."""
        ...

    async def create_tenant(self, name: str, account_ids: Sequence[str], **options: Unpack[TenantOptions]) -> Tenant:
        """Create a tenant owning `account_ids` (a random id unless `tenant_id` is given).

        Raises Conflict if the tenant id exists or any account is owned by another tenant;
        nothing is written in that case.
        """
        ...

    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        """The tenant, or None."""
        ...

    async def get_tenant_by_account(self, account_id: str) -> Tenant | None:
        """The tenant owning `account_id`, or None."""
        ...

    async def list_tenants(self) -> list[Tenant]:
        """Every tenant, oldest first (ties by id)."""
        ...

    async def create_key(self, tenant_id: str, **options: Unpack[KeyOptions]) -> tuple[ApiKey, str]:
        """Create a key for an existing tenant; returns the key and its secret.

        The secret is returned only here: the store keeps its SHA-256 hash. Raises NotFound
        for an unknown tenant.
        """
        ...

    async def lookup_key(self, secret: str) -> ApiKey | None:
        """The key a presented secret belongs to, or None if unknown or revoked.

        Found by hash and confirmed with a constant-time comparison. A revocation is seen by every
        replica within one second: Redis is read on every lookup; the local store sees its own
        revocations at once and another process's (the CLI on the same SQLite file) within
        `sqlite_refresh_s` (at once in the file's shared mode). Requests admitted before a revocation
        run to their end (SECURITY.md, "Key revocation").
        """
        ...

    async def get_key(self, key_id: str) -> ApiKey | None:
        """The key by id (revoked ones included), or None."""
        ...

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        """The tenant's keys, revoked ones included, oldest first. Never hashes or secrets."""
        ...

    async def revoke_key(self, key_id: str) -> bool:
        """Revoke a key at once; False if there is no such key (revoking twice returns True)."""
        ...

    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        """The secret stored under `name`; if there is none yet, `candidate` is stored and returned.

        Atomic set-if-absent: replicas racing at first start all get the one value that won, and
        it survives restarts (SQLite file, Redis key without TTL), so every gateway derives the
        same values from it without configuration (e.g. the tenant cache salt, gateway/pipeline/tenant_salt.py).
        """
        ...
