"""`LocalTenancy`: tenants, keys and secrets in the SQLite file, tenants and keys cached in memory.

They are read from the file at start and kept in memory (written through on change), so lookups
never touch the disk. What another process commits to the file (`edgerun tenants|keys ...` without
`--gateway`, on the file of a running gateway; another worker in the file's shared mode) is taken in
on the first call at least `refresh_s` after the last check (`sqlite_refresh_s`, 0.5 s; 0 in the
shared mode): one read of the catalog version (which triggers raise on every tenant or key written,
whoever writes it) on the worker thread tells whether anything changed; if so, tenants and keys are
read again and merged (tenants and keys are only ever added, and a revocation only ever set, so
merging never undoes a change made here meanwhile). A CLI revocation thus holds within that period
plus one read. A tenant found in memory is current (tenants never change), so in the shared mode
its lookups skip the check.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Unpack

from gateway.store import apikeys
from gateway.store.checks import check_id
from gateway.store.errors import Conflict, NotFound
from gateway.store.local.file import LocalFile
from gateway.store.models import ApiKey, KeyOptions, Tenant, TenantOptions, copied, new_key, new_tenant


class LocalTenancy:
    def __init__(self, file: LocalFile, refresh_s: float, clock: Callable[[], float] = time.time) -> None:
        """Load tenants and keys from `file`; `clock` stamps created_at and revoked_at (tests may pass their own)."""
        self._file = file
        self._clock = clock
        self._refresh_s = refresh_s
        self._trust_cached_tenants = refresh_s == 0  # the shared mode: a cached tenant needs no check
        db = file.db
        self._tenants = {t.id: t for t in db.load_tenants()}
        self._accounts = {a: t.id for t in self._tenants.values() for a in t.account_ids}
        self._keys: dict[str, ApiKey] = {}
        self._key_hashes: dict[str, str] = {}  # key id -> hash
        self._key_by_hash: dict[str, str] = {}  # hash -> key id
        for key, key_hash in db.load_keys():
            self._remember_key(key, key_hash)
        self._catalog_version = db.catalog_version()
        self._checked_at = time.monotonic()
        self._refreshing: asyncio.Task[None] | None = None

    async def _may_refresh(self) -> None:
        """Take in tenants and keys another process committed, once the last check is
        `refresh_s` old (callers meanwhile wait for the same check)."""
        if not self._file.is_file or time.monotonic() - self._checked_at < self._refresh_s:
            return
        if self._refreshing is None:
            self._refreshing = asyncio.create_task(self._refresh(), name="edgerun-sqlite-refresh")
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        started = time.monotonic()
        try:
            # Reads: they may run while the shared mode's group transaction is open (WAL: never blocked).
            if await self._file.run(self._file.db.catalog_version, grouped=True) != self._catalog_version:
                version, tenants, keys = await self._file.run(self._file.db.load_tenants_and_keys, grouped=True)
                self._merge(tenants, keys)
                self._catalog_version = version
            self._checked_at = started
        finally:
            self._refreshing = None

    def _merge(self, tenants: list[Tenant], keys: list[tuple[ApiKey, str]]) -> None:
        for tenant in tenants:
            if tenant.id not in self._tenants:
                self._tenants[tenant.id] = tenant
                for account in tenant.account_ids:
                    self._accounts.setdefault(account, tenant.id)
        for key, key_hash in keys:
            known = self._keys.get(key.id)
            if known is None:
                self._remember_key(key, key_hash)
            elif known.revoked_at is None and key.revoked_at is not None:
                known.revoked_at = key.revoked_at

    async def close(self) -> None:
        if self._refreshing is not None:
            await asyncio.wait({self._refreshing})

    # --- the request's one call ---

    async def authenticate(self, secret: str) -> tuple[ApiKey, Tenant] | None:
        key = await self.lookup_key(secret)
        if key is None:
            return None
        tenant = self._tenants.get(key.tenant_id)
        return None if tenant is None else (key, copied(tenant))

    # --- tenants ---

    async def create_tenant(self, name: str, account_ids: Sequence[str], **options: Unpack[TenantOptions]) -> Tenant:
        await self._may_refresh()
        tenant = new_tenant(name, account_ids, now=self._clock(), **options)
        if tenant.id in self._tenants:
            raise Conflict(f"tenant {tenant.id!r} already exists")
        for account in tenant.account_ids:
            if account in self._accounts:
                raise Conflict(f"account {account!r} is already owned by another tenant")
        # Claim in memory first (no await in between), then persist; undo if the write fails.
        self._tenants[tenant.id] = tenant
        self._accounts.update((a, tenant.id) for a in tenant.account_ids)
        try:
            await self._file.run(self._file.db.insert_tenant, tenant)
        except BaseException as exc:
            del self._tenants[tenant.id]
            for account in tenant.account_ids:
                del self._accounts[account]
            if isinstance(exc, sqlite3.IntegrityError):  # another process took the id or an account just now
                raise Conflict(f"tenant {tenant.id!r} or one of its accounts was just created elsewhere") from exc
            raise
        return copied(tenant)

    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        if not (self._trust_cached_tenants and tenant_id in self._tenants):
            await self._may_refresh()
        tenant = self._tenants.get(tenant_id)
        return None if tenant is None else copied(tenant)

    async def get_tenant_by_account(self, account_id: str) -> Tenant | None:
        if not (self._trust_cached_tenants and account_id in self._accounts):
            await self._may_refresh()
        tenant_id = self._accounts.get(account_id)
        return None if tenant_id is None else copied(self._tenants[tenant_id])

    async def list_tenants(self) -> list[Tenant]:
        await self._may_refresh()
        return sorted((copied(t) for t in self._tenants.values()), key=lambda t: (t.created_at, t.id))

    # --- API keys ---

    def _remember_key(self, key: ApiKey, key_hash: str) -> None:
        self._keys[key.id] = key
        self._key_hashes[key.id] = key_hash
        self._key_by_hash[key_hash] = key.id

    async def create_key(self, tenant_id: str, **options: Unpack[KeyOptions]) -> tuple[ApiKey, str]:
        await self._may_refresh()
        if tenant_id not in self._tenants:
            raise NotFound(f"tenant {tenant_id!r} does not exist")
        key, secret, key_hash = new_key(tenant_id, now=self._clock(), **options)
        await self._file.run(self._file.db.insert_key, key, key_hash)
        self._remember_key(key, key_hash)
        return copied(key), secret

    async def lookup_key(self, secret: str) -> ApiKey | None:
        await self._may_refresh()
        presented = apikeys.hash_secret(secret)
        if presented is None:
            return None
        key_id = self._key_by_hash.get(presented)
        if key_id is None or not apikeys.same_hash(self._key_hashes[key_id], presented):
            return None
        key = self._keys[key_id]
        return None if key.is_revoked else copied(key)

    async def get_key(self, key_id: str) -> ApiKey | None:
        await self._may_refresh()
        key = self._keys.get(key_id)
        return None if key is None else copied(key)

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        await self._may_refresh()
        keys = [copied(k) for k in self._keys.values() if k.tenant_id == tenant_id]
        return sorted(keys, key=lambda k: (k.created_at, k.id))

    async def revoke_key(self, key_id: str) -> bool:
        await self._may_refresh()
        key = self._keys.get(key_id)
        if key is None:
            return False
        if key.revoked_at is None:
            key.revoked_at = self._clock()  # effective at once; the row follows
            await self._file.run(self._file.db.revoke_key, key_id, key.revoked_at)
        return True

    # --- server-side secrets ---

    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        return await self._file.run(self._file.db.get_or_create_secret, check_id("secret name", name), candidate)
