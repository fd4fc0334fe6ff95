"""`edgerun tenants ...` and `edgerun keys ...`: tenant and API key administration.

    edgerun tenants create --name NAME --account ACCOUNT [--account ...] [--model M ...] [--budget-micro N] [--id ID]
                           [--max-concurrent N]
    edgerun tenants list
    edgerun keys create --tenant TENANT [--model M ...] [--rpm N] [--tpm N]
    edgerun keys list --tenant TENANT
    edgerun keys revoke KEY_ID

With `--gateway URL` the command goes through a running gateway's admin API (admin token from
`--admin-token` or EDGERUN_ADMIN_TOKEN). Without it the command opens the configured store
itself: Redis (every replica sees the change at once), or the SQLite file of the local store,
whose running gateway takes the change in within `sqlite_refresh_s` (0.5 s).
Output is JSON; a new key's secret is printed once and never again.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

import httpx

from gateway.errors import GatewayError
from gateway.http.admin import AdminService
from gateway.settings import GatewaySettings
from gateway.store.errors import StoreError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    noun = parser.prog.split()[-1]  # "tenants" or "keys": one module serves both commands
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--gateway", metavar="URL", help="use this running gateway's admin API instead of the store")
    common.add_argument("--admin-token", help="admin token for --gateway (default: EDGERUN_ADMIN_TOKEN)")
    subparsers = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help_text: str) -> argparse.ArgumentParser:
        return subparsers.add_parser(name, help=help_text, parents=[common])

    if noun == "tenants":
        create = action("create", "create a tenant owning one or more account ids")
        create.add_argument("--name", required=True)
        create.add_argument(
            "--account", dest="accounts", action="append", required=True, help="account id (repeatable)"
        )
        create.add_argument(
            "--model", dest="models", action="append", help="allowed model id (repeatable; default all)"
        )
        create.add_argument("--budget-micro", type=int, help="monthly budget in micro-units (default unlimited)")
        create.add_argument("--id", dest="tenant_id", help="tenant id (default random)")
        create.add_argument(
            "--max-concurrent", type=int, help="requests in flight at once (default: the gateway's setting)"
        )
        action("list", "list tenants")
    else:
        create = action("create", "create an API key (its secret is printed once)")
        create.add_argument("--tenant", required=True)
        create.add_argument(
            "--model", dest="models", action="append", help="allowed model id (repeatable; default the tenant's)"
        )
        create.add_argument("--rpm", type=int, help="requests per minute (default unlimited)")
        create.add_argument("--tpm", type=int, help="tokens per minute (default unlimited)")
        listing = action("list", "list a tenant's keys")
        listing.add_argument("--tenant", required=True)
        revoke = action("revoke", "revoke a key at once")
        revoke.add_argument("key_id")


async def _via_store(args: argparse.Namespace, settings: GatewaySettings) -> Any:
    from gateway.store import open_store

    store = open_store(settings.store)
    try:
        admin = AdminService(store.tenancy)
        match (args.command, args.action):
            case ("tenants", "create"):
                return await admin.create_tenant(
                    args.name,
                    args.accounts,
                    allowed_models=args.models,
                    monthly_budget_micro=args.budget_micro,
                    tenant_id=args.tenant_id,
                    max_concurrent_requests=args.max_concurrent,
                )
            case ("tenants", "list"):
                return await admin.list_tenants()
            case ("keys", "create"):
                return await admin.create_key(args.tenant, allowed_models=args.models, rpm=args.rpm, tpm=args.tpm)
            case ("keys", "list"):
                return await admin.list_keys(args.tenant)
            case ("keys", "revoke"):
                return await admin.revoke_key(args.key_id)
    finally:
        await store.aclose()
    raise AssertionError(f"unhandled {args.command} {args.action}")


def _via_gateway(args: argparse.Namespace, token: str | None) -> Any:
    if not token:
        raise SystemExit("--gateway needs an admin token: --admin-token or EDGERUN_ADMIN_TOKEN")
    base = args.gateway.rstrip("/") + "/admin/v1"
    payload: dict[str, Any] | None
    match (args.command, args.action):
        case ("tenants", "create"):
            body = {
                "name": args.name,
                "account_ids": args.accounts,
                "allowed_models": args.models,
                "monthly_budget_micro": args.budget_micro,
                "id": args.tenant_id,
                "max_concurrent_requests": args.max_concurrent,
            }
            method, url, payload = "POST", f"{base}/tenants", body
        case ("tenants", "list"):
            method, url, payload = "GET", f"{base}/tenants", None
        case ("keys", "create"):
            body = {"allowed_models": args.models, "rpm": args.rpm, "tpm": args.tpm}
            method, url, payload = "POST", f"{base}/tenants/{args.tenant}/keys", body
        case ("keys", "list"):
            method, url, payload = "GET", f"{base}/tenants/{args.tenant}/keys", None
        case ("keys", "revoke"):
            method, url, payload = "DELETE", f"{base}/keys/{args.key_id}", None
        case _:
            raise AssertionError(f"unhandled {args.command} {args.action}")
    if payload is not None:
        payload = {k: v for k, v in payload.items() if v is not None}
    response = httpx.request(method, url, json=payload, headers={"authorization": f"Bearer {token}"}, timeout=30)
    answer = response.json()
    if not answer.get("success"):
        raise GatewayError("; ".join(e.get("message", "") for e in answer.get("errors", [])) or response.text)
    return answer["result"]


def logging_options(args: argparse.Namespace) -> dict[str, object]:
    """Warnings only: the output is the JSON result (see cli/main.py)."""
    return {"level": "warning", "json": False}


def run(args: argparse.Namespace) -> int:
    settings = GatewaySettings()
    try:
        if args.gateway:
            token = args.admin_token or (settings.http.admin_token.get_secret_value() if settings.http.admin_token else None)
            result = _via_gateway(args, token)
        else:
            result = asyncio.run(_via_store(args, settings))
    except GatewayError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    except (StoreError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0
