"""The embedded store takes in what another process (the CLI) commits to its SQLite file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.settings import GatewaySettings
from gateway.store.embedded import EmbeddedStore


async def test_another_processs_tenants_keys_and_revocations_arrive_within_the_refresh_period(tmp_path: Path) -> None:
    path = str(tmp_path / "gateway.sqlite3")
    gateway = EmbeddedStore(GatewaySettings(redis_url=None, sqlite_path=path, sqlite_refresh_s=0.05).store)
    cli = EmbeddedStore(GatewaySettings(redis_url=None, sqlite_path=path).store)
    try:
        tenant = await cli.create_tenant("Acme", ["acc"], tenant_id="acme", max_concurrent_requests=3)
        key, secret = await cli.create_key("acme")
        other, other_secret = await cli.create_key("acme")
        await asyncio.sleep(0.06)
        assert await gateway.get_tenant_by_account("acc") == tenant
        assert await gateway.lookup_key(secret) == key
        await gateway.revoke_key(other.id)  # revoked here while the file still says active ...
        await cli.revoke_key(key.id)
        await asyncio.sleep(0.06)
        assert await gateway.lookup_key(secret) is None
        assert await gateway.lookup_key(other_secret) is None  # ... and the merge never undoes it
        assert [k.revoked_at is not None for k in await gateway.list_keys("acme")] == [True, True]
    finally:
        await gateway.aclose()
        await cli.aclose()
