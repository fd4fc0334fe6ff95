"""The local store takes in what another process (the CLI) commits to its SQLite file."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.settings import GatewaySettings
from gateway.store import open_store


async def test_another_processs_tenants_keys_and_revocations_arrive_within_the_refresh_period(tmp_path: Path) -> None:
    path = str(tmp_path / "gateway.sqlite3")
    gateway = open_store(GatewaySettings(redis_url=None, sqlite_path=path, sqlite_refresh_s=0.05).store)
    cli = open_store(GatewaySettings(redis_url=None, sqlite_path=path).store)
    try:
        tenant = await cli.tenancy.create_tenant("Acme", ["acc"], tenant_id="acme", max_concurrent_requests=3)
        key, secret = await cli.tenancy.create_key("acme")
        other, other_secret = await cli.tenancy.create_key("acme")
        await asyncio.sleep(0.06)
        assert await gateway.tenancy.get_tenant_by_account("acc") == tenant
        assert await gateway.tenancy.lookup_key(secret) == key
        await gateway.tenancy.revoke_key(other.id)  # revoked here while the file still says active ...
        await cli.tenancy.revoke_key(key.id)
        await asyncio.sleep(0.06)
        assert await gateway.tenancy.lookup_key(secret) is None
        assert await gateway.tenancy.lookup_key(other_secret) is None  # ... and the merge never undoes it
        assert [k.revoked_at is not None for k in await gateway.tenancy.list_keys("acme")] == [True, True]
    finally:
        await gateway.aclose()
        await cli.aclose()
