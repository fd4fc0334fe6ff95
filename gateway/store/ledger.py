"""The ledger: the record of money. One usage record per request, appended exactly once (keyed by its
request id), read back in ranges (exports, audits) and, for the dashboard, summed per hour.

Only ever appended to, never dropped: the Redis ledger moves old records to a durable SQLite
archive rather than deleting them (`archive`). While the ledger cannot be written, the gateway
spools records to a local file and replays them later (gateway/billing/spool.py); the request id
makes a replay idempotent.

Each append also adds the record to its hour's sums (`HourUsage`: per tenant, model, backend,
region, status and price version; and the hour's time-to-first-token and inter-token values by
microsecond), in the same transaction or script, so a dashboard over 93 days reads a few thousand
rows instead of every record (`hours`). The savings a record's cached tokens made are computed when
it is written (`Savings`: under its own price version, as the gateway's prices say then).

Implementations: `local.ledger.LocalLedger` (the SQLite file) and `redis.ledger.RedisLedger`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from gateway.store.models import UsageRecord

HOUR_S = 3600
Savings = Callable[[UsageRecord], int | None]  # what a record's cached tokens saved; None: unknown (counted 0)


def no_savings(record: UsageRecord) -> int | None:
    """The `Savings` of a store opened without prices (a CLI that writes no records)."""
    return 0 if record.cached_tokens == 0 else None


def hour_of(t: float) -> int:
    """The start (epoch seconds) of the hour `t` falls in."""
    return int(t // HOUR_S) * HOUR_S


@dataclass(frozen=True, slots=True)
class UsageGroup:
    """What a group of records of one hour have in common."""

    tenant_id: str
    model: str
    backend_id: str | None
    region: str | None
    status: str
    price_version: str


@dataclass(slots=True)
class UsageSums:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    cost_micro: int = 0
    savings_micro: int = 0

    def add(self, record: UsageRecord, savings_micro: int) -> None:
        self.requests += 1
        self.prompt_tokens += record.prompt_tokens
        self.cached_tokens += record.cached_tokens
        self.completion_tokens += record.completion_tokens
        self.cost_micro += record.cost_micro
        self.savings_micro += savings_micro

    def merge(self, sums: UsageSums) -> None:
        self.requests += sums.requests
        self.prompt_tokens += sums.prompt_tokens
        self.cached_tokens += sums.cached_tokens
        self.completion_tokens += sums.completion_tokens
        self.cost_micro += sums.cost_micro
        self.savings_micro += sums.savings_micro


@dataclass(slots=True)
class HourUsage:
    """The sums of one hour's records (of one tenant, or of all), as the ledger keeps them."""

    hour: int  # epoch seconds, a multiple of HOUR_S
    groups: dict[UsageGroup, UsageSums] = field(default_factory=dict)
    ttft_us: Counter[int] = field(default_factory=Counter)  # time to first token in whole µs -> records
    itl_us: Counter[int] = field(default_factory=Counter)


@dataclass(frozen=True, slots=True)
class SummedHours:
    """`Ledger.hours`' answer."""

    since: int  # the first hour whose sums are complete; earlier hours must be read record by record
    hours: list[HourUsage]  # oldest first, hours without records left out


def to_latency_us(seconds: float) -> int:
    return round(seconds * 1_000_000)


class Ledger(Protocol):
    async def append(self, record: UsageRecord) -> bool:
        """Append a usage record exactly once; False (and nothing written) if its request_id exists."""
        ...

    def iter_usage(self, start: float, end: float, tenant_id: str | None = None) -> AsyncIterator[UsageRecord]:
        """Records with start <= ended_at < end (optionally one tenant's), by (ended_at, request_id).

        Ordered on the end time in whole microseconds, then request_id; read in pages, so a long
        range does not load at once.
        """
        ...

    async def get(self, request_id: str) -> UsageRecord | None:
        """One record by request id, or None."""
        ...

    async def hours(self, start_hour: int, end_hour: int, tenant_id: str | None = None) -> SummedHours:
        """The sums of the hours from `start_hour` up to (not including) `end_hour` (multiples of
        HOUR_S); one tenant's, or everyone's. Hours before `since` are left out (a ledger that held
        records before it kept sums: read those hours record by record)."""
        ...

    async def archive(self, older_than: float) -> int:
        """Move records that ended before `older_than` to durable storage, where reads still find them;
        returns how many moved. The local ledger is on disk already (0); Redis's is retention."""
        ...


SavingsOf = Callable[[UsageRecord], int]


def savings_or_zero(savings: Savings) -> SavingsOf:
    """`savings` with an unknown result counted as 0 (as the dashboard counts it)."""
    return lambda record: savings(record) or 0
