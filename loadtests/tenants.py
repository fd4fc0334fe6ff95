"""Load-test tenants: each its own account and API key, created through the gateway's admin API.

A tenant list is written `name:weight,...` (e.g. `acme:3,globex:2,initech:1`); the weight is
the share of simulated users (or sessions) that act for that tenant. `provision` creates the
tenants and one key each (`POST /admin/v1/tenants`, `POST /admin/v1/tenants/{id}/keys`) and
returns the secrets, which the gateway shows only once. Keys can be saved to and read back from
a JSON file, for runs against a gateway whose admin token the load generator does not hold.
"""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

DEFAULT_TENANTS = "acme:3,globex:2,initech:1"


class ProvisionError(RuntimeError):
    """The admin API refused or could not be reached."""


@dataclass(frozen=True, slots=True)
class TenantSpec:
    name: str
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class TenantKey:
    """A provisioned tenant: what a client needs to call the gateway as that tenant."""

    name: str
    tenant_id: str
    account_id: str
    secret: str
    weight: float = 1.0


def parse_tenants(text: str) -> list[TenantSpec]:
    """`"acme:3,globex"` -> [TenantSpec("acme", 3.0), TenantSpec("globex", 1.0)]."""
    specs = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, _, weight = item.partition(":")
        if not name.strip():
            raise ValueError(f"tenant entry {item!r}: give name or name:weight")
        try:
            value = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"tenant entry {item!r}: the weight must be a number") from None
        if value <= 0:
            raise ValueError(f"tenant entry {item!r}: the weight must be > 0")
        specs.append(TenantSpec(name.strip(), value))
    if not specs:
        raise ValueError("give at least one tenant (name:weight,...)")
    if len({s.name for s in specs}) != len(specs):
        raise ValueError(f"tenant names must be unique: {text!r}")
    return specs


def _result(response: httpx.Response, what: str) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code >= 400 or not body.get("success"):
        raise ProvisionError(f"{what}: HTTP {response.status_code}: {response.text[:300]}")
    return body["result"]


def provision(base_url: str, admin_token: str, specs: Sequence[TenantSpec], *,
              run_id: str | None = None) -> list[TenantKey]:
    """Create each tenant (owning account `lt-<run>-<name>`) and one API key for it.

    Each call makes new tenants, so two runs never share a cache entry (KV caches are salted
    with the tenant) nor each other's usage in the ledger.
    """
    run_id = run_id or uuid.uuid4().hex[:8]
    headers = {"Authorization": f"Bearer {admin_token}"}
    keys = []
    try:
        with httpx.Client(base_url=base_url, headers=headers, timeout=30.0) as http:
            for spec in specs:
                account_id = f"lt-{run_id}-{spec.name}"
                body = {"name": f"{spec.name} ({run_id})", "account_ids": [account_id]}
                tenant = _result(http.post("/admin/v1/tenants", json=body), f"creating tenant {spec.name}")
                key = _result(http.post(f"/admin/v1/tenants/{tenant['id']}/keys", json={}),
                              f"creating a key for {spec.name}")
                keys.append(TenantKey(spec.name, tenant["id"], account_id, key["secret"], spec.weight))
    except httpx.HTTPError as exc:
        raise ProvisionError(f"the admin API at {base_url} is unreachable: {exc}") from exc
    return keys


def pick(rng: random.Random, keys: Sequence[TenantKey]) -> TenantKey:
    """A tenant chosen with probability proportional to its weight."""
    return rng.choices(list(keys), weights=[k.weight for k in keys])[0]


def save_keys(path: Path, keys: Sequence[TenantKey]) -> None:
    path.write_text(json.dumps([asdict(k) for k in keys], indent=2))


def load_keys(path: Path) -> list[TenantKey]:
    try:
        entries = json.loads(path.read_text())
        keys = [TenantKey(**entry) for entry in entries]
    except (OSError, ValueError, TypeError) as exc:
        shape = "{name, tenant_id, account_id, secret, weight}"
        raise ProvisionError(f"{path}: expected a JSON list of {shape}: {exc}") from exc
    if not keys:
        raise ProvisionError(f"{path}: no tenants")
    return keys
