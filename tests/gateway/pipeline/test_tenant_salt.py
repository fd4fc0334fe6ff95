"""The tenant cache salt (gateway/pipeline/tenant_salt.py): an HMAC with a secret from settings or the store."""

from __future__ import annotations

import hashlib
import hmac

from gateway.pipeline.tenant_salt import SECRET_NAME, TenantSalts, derive_cache_salt
from gateway.store import Store


def test_the_salt_is_hmac_sha256_of_the_tenant() -> None:
    expected = hmac.new(b"k", b"tenant-a", hashlib.sha256).hexdigest()
    assert derive_cache_salt(b"k", "tenant-a") == expected
    assert derive_cache_salt(b"k", "tenant-b") != expected and derive_cache_salt(b"k2", "tenant-a") != expected


async def test_a_configured_secret_is_used_as_given(store: Store) -> None:
    salts = TenantSalts(store.tenancy, "configured")
    assert await salts.salt("t") == derive_cache_salt(b"configured", "t")
    assert "configured" not in repr(salts)


async def test_without_configuration_replicas_share_one_stored_secret(store: Store) -> None:
    first, second = TenantSalts(store.tenancy), TenantSalts(store.tenancy)
    assert await first.salt("t") == await second.salt("t")
    secret = await store.tenancy.get_or_create_secret(SECRET_NAME, "unused")
    assert len(secret) == 64 and await first.salt("t") == derive_cache_salt(secret.encode(), "t")
