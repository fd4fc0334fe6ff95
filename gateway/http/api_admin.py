"""Admin HTTP API (`/admin/v1/...`), guarded by `Authorization: Bearer <admin_token>`.

    POST   /admin/v1/tenants                     {name, account_ids, allowed_models?, monthly_budget_micro?, id?,
                                                  max_concurrent_requests?}
    GET    /admin/v1/tenants
    POST   /admin/v1/tenants/{tenant_id}/keys    {allowed_models?, rpm?, tpm?}  -> the key and its secret, once
    GET    /admin/v1/tenants/{tenant_id}/keys
    DELETE /admin/v1/keys/{key_id}               revoke at once

Answers use the Cloudflare envelope ({result, success, errors, messages}).
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import InvalidInput
from gateway.http.body import read_json_object
from gateway.http.envelopes import JSONBytes, workers_ai_success
from gateway.http.listeners import listener_of
from gateway.services import Services

MAX_ADMIN_INT = 2**63  # SQLite INTEGER and Redis counters are signed 64-bit


def require_admin(request: Request) -> Services:
    """The services, once the request carries the admin token (throttled per client address and listener)."""
    g: Services = request.app.state.services
    client = request.client.host if request.client is not None else None
    g.admin_guard.check(request.headers.get("authorization"), client, listener_of(request.scope))
    return g



def _strings(body: dict[str, Any], name: str, *, required: bool = False) -> list[str] | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value) or (required and not value):
        raise InvalidInput(f"{name} must be {'a non-empty' if required else 'an'} array of strings", param=name)
    return value


def _optional_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_ADMIN_INT):
        raise InvalidInput(f"{name} must be an integer from 0 to 2^63 - 1", param=name)
    return value


def _optional_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidInput(f"{name} must be a string", param=name)
    return value


async def create_tenant(request: Request) -> Response:
    g = require_admin(request)
    body = await read_json_object(request, g.settings.http.max_body_bytes)
    name = _optional_str(body, "name")
    if not name:
        raise InvalidInput("name must be a non-empty string", param="name")
    tenant = await g.admin.create_tenant(
        name,
        _strings(body, "account_ids", required=True) or [],
        allowed_models=_strings(body, "allowed_models"),
        monthly_budget_micro=_optional_int(body, "monthly_budget_micro"),
        tenant_id=_optional_str(body, "id"),
        max_concurrent_requests=_optional_int(body, "max_concurrent_requests"),
    )
    return JSONBytes(workers_ai_success(tenant), status_code=201)


async def list_tenants(request: Request) -> Response:
    g = require_admin(request)
    return JSONBytes(workers_ai_success(await g.admin.list_tenants()))


async def create_key(request: Request) -> Response:
    g = require_admin(request)
    body = await read_json_object(request, g.settings.http.max_body_bytes, allow_empty=True)
    key = await g.admin.create_key(
        request.path_params["tenant_id"],
        allowed_models=_strings(body, "allowed_models"),
        rpm=_optional_int(body, "rpm"),
        tpm=_optional_int(body, "tpm"),
    )
    return JSONBytes(workers_ai_success(key), status_code=201)


async def list_keys(request: Request) -> Response:
    g = require_admin(request)
    return JSONBytes(workers_ai_success(await g.admin.list_keys(request.path_params["tenant_id"])))


async def revoke_key(request: Request) -> Response:
    g = require_admin(request)
    return JSONBytes(workers_ai_success(await g.admin.revoke_key(request.path_params["key_id"])))
