"""The gateway's shared state: tenants, keys, limits, budgets, sessions, prefix index, in-flight counts, ledger.

`open_store(settings)` returns a `Store` (see `base.py` for the contract); the data types are in
`models.py` and the errors in `errors.py`.
"""

from __future__ import annotations

from gateway.store.base import Store
from gateway.store.errors import Conflict, InvalidArgument, NotFound, StoreError, StoreUnavailable, TokensOverLimit
from gateway.store.factory import open_store
from gateway.store.models import ApiKey, BudgetDecision, LimitDecision, Tenant, UsageRecord

__all__ = [
    "ApiKey",
    "BudgetDecision",
    "Conflict",
    "InvalidArgument",
    "LimitDecision",
    "NotFound",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "Tenant",
    "TokensOverLimit",
    "UsageRecord",
    "open_store",
]
