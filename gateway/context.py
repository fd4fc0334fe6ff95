"""Who a request is for: the identity every part of the pipeline, billing included, reads."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.store.models import ApiKey, Tenant


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: its key, the key's tenant, and the account in the URL."""

    key: ApiKey
    tenant: Tenant
    account_id: str
