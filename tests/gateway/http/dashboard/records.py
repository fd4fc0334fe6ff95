"""Ledger records with known numbers, for the dashboard's tests."""

from __future__ import annotations

from typing import Any

from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.store.models import UsageRecord


def record(request_id: str, ended_at: float, **fields: Any) -> UsageRecord:
    values: dict[str, Any] = {
        "request_id": request_id,
        "tenant_id": "acme",
        "account_id": "acc-acme",
        "key_id": "key_1",
        "model": DEFAULT_MODEL_ID,
        "region": "local",
        "backend_id": "b1",
        "session_id": None,
        "started_at": ended_at - 1.0,
        "ended_at": ended_at,
        "status": "ok",
        "prompt_tokens": 100,
        "cached_tokens": 40,
        "completion_tokens": 10,
        "price_version": "unpriced",
        "cost_micro": 0,
        **fields,
    }
    return UsageRecord(**values)
