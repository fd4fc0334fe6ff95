"""The store's values as JSON and back: what crosses the host's socket besides plain JSON values.

The host encodes every result with `plain` (dataclasses become objects of their fields, tuples
lists, frozensets sorted lists); the worker knows each method's result type and rebuilds it with
the functions below, through the dataclasses' own constructors (which validate). A usage record
travels as its fields both ways.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, is_dataclass
from typing import Any, TypeVar

from gateway.store.errors import InvalidArgument
from gateway.store.models import ApiKey, BudgetDecision, LimitDecision, Tenant, UsageRecord

T = TypeVar("T")
_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in fields(cls)) for cls in (Tenant, ApiKey, LimitDecision, BudgetDecision, UsageRecord)
}
_SCALARS = (str, int, float, bool, type(None))


def plain(value: Any) -> Any:
    """`value` as JSON values (the host's results, a worker's usage record)."""
    if isinstance(value, _SCALARS):
        return value
    names = _FIELDS.get(type(value))
    if names is not None:
        return {name: plain(getattr(value, name)) for name in names}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, frozenset | set):
        return sorted(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if is_dataclass(value):
        raise TypeError(f"{type(value).__name__} has no codec")
    return value  # anything else fails in json, as the caller's TypeError


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


def many(decode: Callable[[Any], T]) -> Callable[[Any], list[T]]:
    return lambda data: [decode(item) for item in data]


optional_tenant = optional(tenant)
optional_key = optional(key)
optional_record = optional(record)
