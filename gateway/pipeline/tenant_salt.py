"""The per-tenant cache salt: HMAC-SHA256(server-side secret, tenant id), hex.

Backends share a cached prefix only between requests with the same `cache_salt`. Sending the
tenant id itself would let anyone who can reach a backend and knows (or guesses) a tenant id
probe that tenant's cache; the HMAC makes the salt unguessable without the secret. The gateway
roots its own prefix chain (`policies.prefix`) in the same derived salt, so the block hashes
backends report in their KV events match the gateway's prefix index.

The secret is `settings.cache_salt_secret` when set; otherwise one is generated on first use and
kept in the shared store (`Tenancy.get_or_create_secret`), so every replica and every restart agrees
without configuration. It is loaded lazily (a store that is down at start-up only delays it) and
never logged. Changing it moves every tenant to fresh salts: cached prefixes stop matching once,
nothing else changes (SECURITY.md, rotation).
"""

from __future__ import annotations

import asyncio
import hmac
import secrets

from gateway.store.tenancy import Tenancy

SECRET_NAME = "cache-salt"


def derive_cache_salt(secret: bytes, tenant_id: str) -> str:
    """HMAC-SHA256(secret, tenant id) as 64 hex characters."""
    return hmac.digest(secret, tenant_id.encode(), "sha256").hex()


class TenantSalts:
    """tenant id -> the `cache_salt` sent to backends and used to salt the prefix chain."""

    def __init__(self, tenancy: Tenancy, configured: str | None = None) -> None:
        self._tenancy = tenancy
        self._secret: bytes | None = configured.encode() if configured else None
        self._lock = asyncio.Lock()
        self._salts: dict[str, str] = {}  # derived once per tenant: the secret does not change in a process

    async def salt(self, tenant_id: str) -> str:
        salt = self._salts.get(tenant_id)
        if salt is None:
            secret = self._secret or await self._load()
            salt = self._salts[tenant_id] = derive_cache_salt(secret, tenant_id)
        return salt

    async def _load(self) -> bytes:
        async with self._lock:
            if self._secret is None:
                value = await self._tenancy.get_or_create_secret(SECRET_NAME, secrets.token_hex(32))
                self._secret = value.encode()
            return self._secret

    def __repr__(self) -> str:  # never the secret
        return f"TenantSalts(loaded={self._secret is not None})"
