"""The store's values as JSON and back: what crosses the host's socket besides plain JSON values.

Both sides' JSON encoder turns the store's dataclasses into objects of their fields and sets into
sorted lists (`to_json`); the worker knows each method's result type and rebuilds it with the
functions below, through the dataclasses' own constructors (which validate). A usage record
travels as its fields both ways.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, TypeVar

from gateway.store.errors import InvalidArgument
from gateway.store.models import ApiKey, BudgetDecision, LimitDecision, Tenant, UsageRecord

T = TypeVar("T")
_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in (Tenant, ApiKey, LimitDecision, BudgetDecision, UsageRecord)
}


def to_json(value: Any) -> Any:
    """The JSON encoder's `default`: the store's dataclasses as objects of their fields, sets as
    sorted lists (tuples and dicts it encodes itself). TypeError for anything else."""
    names = _FIELDS.get(type(value))
    if names is not None:
        return {name: getattr(value, name) for name in names}
    if isinstance(value, frozenset | set):
        return sorted(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def record(data: Any) -> UsageRecord:
    """A usage record from its fields (checked: on the host they come from the socket)."""
    if not isinstance(data, dict) or set(data) != set(_FIELDS[UsageRecord]):
        raise InvalidArgument(f"a usage record needs exactly the fields {', '.join(_FIELDS[UsageRecord])}")
    return UsageRecord(**data)


def tenant(data: dict[str, Any]) -> Tenant:
    return Tenant(**data)


def key(data: dict[str, Any]) -> ApiKey:
    return ApiKey(**data)


def key_and_secret(data: list[Any]) -> tuple[ApiKey, str]:
    return key(data[0]), data[1]


def limit_decision(data: dict[str, Any]) -> LimitDecision:
    return LimitDecision(**data)


def budget_decision(data: dict[str, Any]) -> BudgetDecision:
    return BudgetDecision(**data)


def loads(data: dict[str, list[int]]) -> dict[str, tuple[int, int]]:
    return {backend: (prefill, decode) for backend, (prefill, decode) in data.items()}


def optional(decode: Callable[[Any], T]) -> Callable[[Any], T | None]:
    return lambda data: None if data is None else decode(data)


optional_tenant = optional(tenant)
optional_key = optional(key)
optional_record = optional(record)
