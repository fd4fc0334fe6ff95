"""Tenant and key administration: the one service behind the admin HTTP API and the CLI.

Values are validated by the store (ids, counts) and reported as `GatewayError`s; secrets are
returned only by `create_key`, once. Listings never include hashes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Unpack

from gateway.errors import GatewayError, InvalidInput
from gateway.store.errors import Conflict, InvalidArgument, NotFound
from gateway.store.models import ApiKey, KeyOptions, Tenant, TenantOptions
from gateway.store.tenancy import Tenancy


class ResourceNotFound(GatewayError):
    """Admin API only: the HTTP status doubles as the code (no Workers AI code applies)."""

    code, status, openai_type = 404, 404, "not_found_error"


class ResourceConflict(GatewayError):
    code, status, openai_type = 409, 409, "conflict_error"


def tenant_json(tenant: Tenant) -> dict[str, Any]:
    return {
        "id": tenant.id,
        "name": tenant.name,
        "account_ids": list(tenant.account_ids),
        "allowed_models": sorted(tenant.allowed_models) if tenant.allowed_models is not None else None,
        "monthly_budget_micro": tenant.monthly_budget_micro,
        "max_concurrent_requests": tenant.max_concurrent_requests,
        "created_at": tenant.created_at,
    }


def key_json(key: ApiKey) -> dict[str, Any]:
    return {
        "id": key.id,
        "tenant_id": key.tenant_id,
        "prefix": key.prefix,
        "allowed_models": sorted(key.allowed_models) if key.allowed_models is not None else None,
        "rpm": key.rpm,
        "tpm": key.tpm,
        "created_at": key.created_at,
        "revoked_at": key.revoked_at,
    }


class AdminService:
    def __init__(self, tenancy: Tenancy) -> None:
        self.tenancy = tenancy

    async def create_tenant(
        self, name: str, account_ids: Sequence[str], **options: Unpack[TenantOptions]
    ) -> dict[str, Any]:
        with _store_errors():
            tenant = await self.tenancy.create_tenant(name, list(account_ids), **options)
        return tenant_json(tenant)

    async def list_tenants(self) -> list[dict[str, Any]]:
        return [tenant_json(t) for t in await self.tenancy.list_tenants()]

    async def create_key(self, tenant_id: str, **options: Unpack[KeyOptions]) -> dict[str, Any]:
        """The new key and, under "secret", its secret: shown this once, stored only as a hash."""
        with _store_errors():
            key, secret = await self.tenancy.create_key(tenant_id, **options)
        return {**key_json(key), "secret": secret}

    async def list_keys(self, tenant_id: str) -> list[dict[str, Any]]:
        with _store_errors():
            if await self.tenancy.get_tenant(tenant_id) is None:
                raise NotFound(f"no tenant {tenant_id!r}")
            return [key_json(k) for k in await self.tenancy.list_keys(tenant_id)]

    async def revoke_key(self, key_id: str) -> dict[str, Any]:
        with _store_errors():
            if not await self.tenancy.revoke_key(key_id):
                raise NotFound(f"no key {key_id!r}")
            key = await self.tenancy.get_key(key_id)
        assert key is not None
        return key_json(key)


@contextmanager
def _store_errors() -> Iterator[None]:
    """Store errors -> admin API errors."""
    try:
        yield
    except NotFound as exc:
        raise ResourceNotFound(str(exc)) from exc
    except Conflict as exc:
        raise ResourceConflict(str(exc)) from exc
    except InvalidArgument as exc:
        raise InvalidInput(str(exc)) from exc
