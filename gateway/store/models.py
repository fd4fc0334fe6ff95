"""What the store keeps: plain dataclasses, validated on construction.

Times are UNIX epoch seconds (float); money is integer micro-units (1 USD = 1_000_000).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypedDict, TypeVar, Unpack

from gateway.store import apikeys
from gateway.store.checks import check_accounts, check_count, check_id, check_models, check_text
from gateway.store.errors import InvalidArgument

# cached: answered from the response cache (gateway/pipeline/answer_cache.py), no backend, 0 tokens
USAGE_STATUSES = ("ok", "cancelled", "backend_error", "rejected", "cached")
UsageStatus = Literal["ok", "cancelled", "backend_error", "rejected", "cached"]


@dataclass(slots=True)
class Tenant:
    id: str
    name: str
    account_ids: tuple[str, ...]  # Workers AI account ids this tenant owns (at least one)
    allowed_models: frozenset[str] | None  # None: every model
    monthly_budget_micro: int | None  # None: unlimited
    created_at: float
    # Requests in flight at once for the tenant, over all replicas; None: the gateway's default
    # (`tenant_max_concurrent_requests`).
    max_concurrent_requests: int | None = None

    def __post_init__(self) -> None:
        check_id("tenant id", self.id)
        check_text("tenant name", self.name)
        self.account_ids = check_accounts(self.account_ids)
        self.allowed_models = check_models(self.allowed_models)
        check_count("monthly_budget_micro", self.monthly_budget_micro, allow_none=True)
        check_count("max_concurrent_requests", self.max_concurrent_requests, allow_none=True, positive=True)

    def allows_model(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


class TenantOptions(TypedDict, total=False):
    """`create_tenant`'s optional settings, each None (or left out) for its default."""

    allowed_models: Iterable[str] | None  # None: every model
    monthly_budget_micro: int | None  # None: unlimited
    tenant_id: str | None  # None: a fresh id
    max_concurrent_requests: int | None  # None: the gateway's default


class KeyOptions(TypedDict, total=False):
    """`create_key`'s optional settings, each None (or left out) for no limit of its own."""

    allowed_models: Iterable[str] | None  # None: whatever the tenant allows
    rpm: int | None
    tpm: int | None


def new_tenant(name: str, account_ids: Iterable[str], *, now: float, **options: Unpack[TenantOptions]) -> Tenant:
    """A validated tenant, with a fresh id unless `tenant_id` is given (both stores create them so)."""
    tenant_id = options.get("tenant_id")
    return Tenant(
        id=tenant_id if tenant_id is not None else apikeys.new_id("ten"), name=name,
        account_ids=check_accounts(account_ids), allowed_models=check_models(options.get("allowed_models")),
        monthly_budget_micro=options.get("monthly_budget_micro"), created_at=now,
        max_concurrent_requests=options.get("max_concurrent_requests"),
    )


@dataclass(slots=True)
class ApiKey:
    """An API key as the gateway sees it. The secret is never stored and its hash never leaves the store."""

    id: str
    tenant_id: str
    prefix: str  # first characters of the secret, for listings ("edg_ab12cd")
    allowed_models: frozenset[str] | None  # None: whatever the tenant allows
    rpm: int | None  # requests per minute; None: unlimited
    tpm: int | None  # tokens per minute; None: unlimited
    created_at: float
    revoked_at: float | None = None

    def __post_init__(self) -> None:
        self.allowed_models = check_models(self.allowed_models)
        check_count("rpm", self.rpm, allow_none=True, positive=True)
        check_count("tpm", self.tpm, allow_none=True, positive=True)

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    def allows_model(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


def new_key(tenant_id: str, *, now: float, **options: Unpack[KeyOptions]) -> tuple[ApiKey, str, str]:
    """A validated key for `tenant_id`, its secret and the secret's hash (both stores create them so)."""
    secret = apikeys.new_secret()
    key = ApiKey(
        id=apikeys.new_id("key"), tenant_id=tenant_id, prefix=apikeys.shown_prefix(secret),
        allowed_models=check_models(options.get("allowed_models")), rpm=options.get("rpm"), tpm=options.get("tpm"),
        created_at=now,
    )
    key_hash = apikeys.hash_secret(secret)
    assert key_hash is not None
    return key, secret, key_hash


RecordT = TypeVar("RecordT", Tenant, ApiKey)
_COPIED_FIELDS = {kind: tuple(f.name for f in fields(kind)) for kind in (Tenant, ApiKey)}


def copied(record: RecordT) -> RecordT:
    """A shallow copy of a `Tenant` or `ApiKey` for a caller to keep, without running its checks
    again (`dataclasses.replace` would): they held when it was made, and every field is immutable."""
    copy = object.__new__(type(record))
    for name in _COPIED_FIELDS[type(record)]:
        setattr(copy, name, getattr(record, name))
    return copy


@dataclass(slots=True, frozen=True)
class LimitDecision:
    allowed: bool
    retry_after_s: float  # 0.0 when allowed; else seconds until the same request would fit
    which: Literal["rpm", "tpm"] | None  # the limit that refused it


@dataclass(slots=True)
class UsageRecord:
    """One billed (or refused) request: the ledger's row, keyed by request_id."""

    request_id: str
    tenant_id: str
    account_id: str
    key_id: str
    model: str
    region: str | None
    backend_id: str | None  # None when refused before routing
    session_id: str | None
    started_at: float
    ended_at: float
    status: UsageStatus
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    price_version: str
    cost_micro: int
    metadata: dict[str, Any] = field(default_factory=dict)  # from cf-aig-metadata
    # Seconds from the request's arrival to its first generated text, and the mean gap between its
    # generated tokens after that; None when unknown (no text, one token, or written before these fields).
    ttft_s: float | None = None
    itl_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.request_id, str) or not 0 < len(self.request_id) <= 200:
            raise InvalidArgument("request_id must be a non-empty string of at most 200 characters")
        check_id("tenant id", self.tenant_id)
        if self.status not in USAGE_STATUSES:
            raise InvalidArgument(f"status {self.status!r} is not one of {', '.join(USAGE_STATUSES)}")
        for name in ("prompt_tokens", "cached_tokens", "completion_tokens", "cost_micro"):
            check_count(name, getattr(self, name))
        if self.cached_tokens > self.prompt_tokens:
            raise InvalidArgument("cached_tokens cannot exceed prompt_tokens")
        if not 0 <= self.started_at <= self.ended_at:
            raise InvalidArgument("need 0 <= started_at <= ended_at")
        for name in ("ttft_s", "itl_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
                raise InvalidArgument(f"{name} must be None or a finite number of seconds >= 0")
        if not isinstance(self.metadata, dict):
            raise InvalidArgument("metadata must be a dict")
        if not self.metadata:  # most requests carry none: nothing to try
            return
        try:
            json.dumps(self.metadata)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"metadata must be JSON-serialisable: {exc}") from exc

    @property
    def ended_us(self) -> int:
        """The ledger's ordering key: end time in whole microseconds."""
        return to_us(self.ended_at)

    def to_json(self) -> str:
        # the fields read directly: `asdict` deep-copies each value first, 3x the cost of the encoding
        # (one record per request); the values are JSON values already (metadata checked above)
        return _RECORD_ENCODER.encode({name: getattr(self, name) for name in _USAGE_FIELDS})

    @classmethod
    def from_json(cls, text: str) -> UsageRecord:
        return cls(**json.loads(text))


_USAGE_FIELDS = tuple(f.name for f in fields(UsageRecord))
# What `json.dumps(..., separators=(",", ":"), sort_keys=True)` builds on every call, built once.
_RECORD_ENCODER = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def to_us(t: float) -> int:
    """Epoch seconds -> whole microseconds, the same rounding in every store."""
    return round(t * 1_000_000)
