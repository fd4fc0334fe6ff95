"""The dashboard's numbers: the ledger's hourly sums and records (and a few live figures) folded into
one JSON-able summary.

Pure: no I/O, no clock. `Window.split` says which hours of the window the ledger's hourly sums
answer (`UsageSummary.add_hour`: an hour wholly inside the window and inside one bucket) and which
stretches must be read record by record (`UsageSummary.add`: the caller streams them from the
store, so a long range is never loaded at once); `to_json` renders:

- totals over the window: requests, prompt / cached / completion tokens, spend, the money the
  cached-input discount saved, the cached share of prompt tokens, requests that did not end "ok" (or "cached": answered
  from the response cache);
- a time series per bucket (by each record's end time): requests, tokens, spend, savings;
- time to first token and inter-token latency percentiles (nearest rank, to the microsecond) over
  the records that carry them; past `MAX_SAMPLES` values a seeded reservoir keeps a uniform sample;
- requests by ledger status, by backend and by region, each with its prefix-cache hit ratio
  (cached prompt tokens / prompt tokens), and by tenant;
- what the caller adds as `Live`: in-flight tokens and health per backend, errors by code.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.store.ledger import HOUR_S, HourUsage, UsageSums
from gateway.store.models import USAGE_STATUSES, UsageRecord

BUCKET_CHOICES_S = (10, 30, 60, 300, 900, 3600, 6 * 3600, 86_400)
TARGET_BUCKETS = 120  # an automatic bucket gives at most about this many points
MAX_BUCKETS = 2000
MAX_SAMPLES = 100_000  # latency values kept per series for the percentiles
PERCENTILES = (50, 90, 99)


@dataclass(frozen=True, slots=True)
class Window:
    """Records with start <= ended_at < end, counted in buckets of bucket_s seconds from start."""

    start: float
    end: float
    bucket_s: float

    def __post_init__(self) -> None:
        if not self.end > self.start:
            raise ValueError("'to' must be after 'from'")
        if not self.bucket_s > 0:
            raise ValueError("bucket must be a positive number of seconds")
        if not (self.end - self.start) / self.bucket_s <= MAX_BUCKETS:  # inf too (a tiny bucket), unlike num_buckets
            raise ValueError(f"a bucket of {self.bucket_s:g}s makes more than {MAX_BUCKETS} buckets: choose a larger one")

    @classmethod
    def auto(cls, start: float, end: float, bucket_s: float | None = None) -> Window:
        """The window, with the smallest standard bucket giving at most TARGET_BUCKETS points when none is given."""
        if bucket_s is None:
            span = max(end - start, 1.0)
            bucket_s = next((b for b in BUCKET_CHOICES_S if span / b <= TARGET_BUCKETS), BUCKET_CHOICES_S[-1])
        return cls(start, end, float(bucket_s))

    @property
    def num_buckets(self) -> int:
        return max(1, math.ceil((self.end - self.start) / self.bucket_s))

    def bucket_of(self, t: float) -> int:
        return min(self.num_buckets - 1, max(0, int((t - self.start) // self.bucket_s)))

    def whole_hour(self, hour: int) -> bool:
        """Whether every record of the hour starting at `hour` is in the window and in one bucket."""
        if hour < self.start or hour + HOUR_S > self.end:
            return False
        bucket = self.bucket_of(hour)
        return bucket == self.num_buckets - 1 or hour + HOUR_S <= self.start + (bucket + 1) * self.bucket_s

    def split(self, since: int) -> tuple[list[int], list[tuple[float, float]]]:
        """(the whole hours from `since` on, which the hourly sums answer; the rest of the window as
        [from, to) stretches to read record by record, adjacent ones joined)."""
        whole: list[int] = []
        stretches: list[tuple[float, float]] = []
        hour = int(self.start // HOUR_S) * HOUR_S
        while hour < self.end:
            if hour >= since and self.whole_hour(hour):
                whole.append(hour)
            else:
                low, high = max(float(hour), self.start), min(float(hour + HOUR_S), self.end)
                if stretches and stretches[-1][1] == low:
                    stretches[-1] = (stretches[-1][0], high)
                else:
                    stretches.append((low, high))
            hour += HOUR_S
        return whole, stretches


def percentile(sorted_values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of already sorted values; None when there are none."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(slots=True)
class Samples:
    """Latency values for percentiles: all of them up to MAX_SAMPLES, then a uniform reservoir."""

    count: int = 0
    values: list[float] = field(default_factory=list)
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

    def add(self, value: float, times: int = 1) -> None:
        fits = min(times, MAX_SAMPLES - len(self.values))
        if fits > 0:  # below the bound: every value is kept
            self.values.extend([value] * fits)
            self.count += fits
        for _ in range(times - max(fits, 0)):
            self.count += 1
            slot = self._rng.randrange(self.count)
            if slot < MAX_SAMPLES:
                self.values[slot] = value

    def to_json(self) -> dict[str, Any]:
        ordered = sorted(self.values)
        return {"count": self.count, **{f"p{p}": percentile(ordered, p) for p in PERCENTILES}}


@dataclass(slots=True)
class Tally(UsageSums):
    """Sums over a group of records (and what the dashboard derives from them)."""

    @property
    def hit_ratio(self) -> float | None:
        """Cached share of prompt tokens: the prefix cache's hit ratio for this group."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "cost_micro": self.cost_micro,
            "savings_micro": self.savings_micro,
            "hit_ratio": self.hit_ratio,
        }


@dataclass(frozen=True, slots=True)
class BackendLive:
    backend_id: str
    region: str
    healthy: bool
    inflight_prefill: int
    inflight_decode: int
    # whether its answers say how many prompt tokens were cached (None: not known yet), and if not, what to do
    reports_cached_tokens: bool | None = None
    billing_problem: str | None = None
    kv_tier_hit_blocks: dict[str, int] | None = None  # prompt blocks from its host tier and region pool so far


@dataclass(frozen=True, slots=True)
class ErrorCount:
    code: int
    status: int
    count: int


@dataclass(frozen=True, slots=True)
class Live:
    """Figures that are not in the ledger: the store's and this replica's view right now."""

    backends: tuple[BackendLive, ...] = ()
    errors: tuple[ErrorCount, ...] | None = None  # None: not shown (a tenant's view)


@dataclass(slots=True)
class UsageSummary:
    """Fold ledger records of one window into the dashboard's figures."""

    window: Window
    totals: Tally = field(default_factory=Tally)
    buckets: list[Tally] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_STATUSES, 0))
    by_backend: dict[str, Tally] = field(default_factory=dict)
    backend_region: dict[str, str | None] = field(default_factory=dict)
    by_region: dict[str, Tally] = field(default_factory=dict)
    by_tenant: dict[str, Tally] = field(default_factory=dict)
    ttft: Samples = field(default_factory=Samples)
    itl: Samples = field(default_factory=Samples)

    def __post_init__(self) -> None:
        if not self.buckets:
            self.buckets = [Tally() for _ in range(self.window.num_buckets)]

    def add(self, record: UsageRecord, savings_micro: int | None = None) -> None:
        """Count one record; `savings_micro` is what its cached tokens saved (None: unknown, counted 0)."""
        saved = savings_micro or 0
        self.totals.add(record, saved)
        self.buckets[self.window.bucket_of(record.ended_at)].add(record, saved)
        self.statuses[record.status] = self.statuses.get(record.status, 0) + 1
        if record.backend_id is not None:
            self.by_backend.setdefault(record.backend_id, Tally()).add(record, saved)
            self.backend_region[record.backend_id] = record.region
        if record.region is not None:
            self.by_region.setdefault(record.region, Tally()).add(record, saved)
        self.by_tenant.setdefault(record.tenant_id, Tally()).add(record, saved)
        if record.ttft_s is not None:
            self.ttft.add(record.ttft_s)
        if record.itl_s is not None:
            self.itl.add(record.itl_s)

    def add_hour(self, usage: HourUsage) -> None:
        """Count one of the ledger's hourly sums (an hour `Window.whole_hour` accepts)."""
        bucket = self.buckets[self.window.bucket_of(usage.hour)]
        totals, statuses = self.totals, self.statuses
        for group, sums in usage.groups.items():
            totals.merge(sums)
            bucket.merge(sums)
            statuses[group.status] = statuses.get(group.status, 0) + sums.requests
            if group.backend_id is not None:
                self._tally(self.by_backend, group.backend_id).merge(sums)
                self.backend_region[group.backend_id] = group.region
            if group.region is not None:
                self._tally(self.by_region, group.region).merge(sums)
            self._tally(self.by_tenant, group.tenant_id).merge(sums)
        for samples, counts in ((self.ttft, usage.ttft_us), (self.itl, usage.itl_us)):
            for value_us in sorted(counts):
                samples.add(value_us / 1_000_000, counts[value_us])

    @staticmethod
    def _tally(tallies: dict[str, Tally], name: str) -> Tally:
        found = tallies.get(name)
        if found is None:
            found = tallies[name] = Tally()
        return found

    def to_json(self, live: Live | None = None, *, tenant: str | None, is_admin: bool) -> dict[str, Any]:
        live = live or Live()
        w = self.window
        totals = self.totals.to_json()
        totals["failed"] = self.totals.requests - self.statuses.get("ok", 0) - self.statuses.get("cached", 0)
        return {
            "scope": {"tenant": tenant, "admin": is_admin},
            "window": {"from": w.start, "to": w.end, "bucket_s": w.bucket_s},
            "totals": totals,
            "series": self._series(),
            "latency": {"ttft_s": self.ttft.to_json(), "itl_s": self.itl.to_json()},
            "statuses": dict(self.statuses),
            "errors_by_code": None if live.errors is None else [
                {"code": e.code, "status": e.status, "count": e.count} for e in live.errors
            ],
            "backends": self._backends(live),
            "regions": [{"region": r, **t.to_json()} for r, t in sorted(self.by_region.items())],
            "tenants": [{"tenant_id": k, **t.to_json()} for k, t in sorted(self.by_tenant.items())],
        }

    def _series(self) -> dict[str, list[Any]]:
        w = self.window
        return {
            "t": [w.start + i * w.bucket_s for i in range(w.num_buckets)],
            "requests": [b.requests for b in self.buckets],
            "prompt_tokens": [b.prompt_tokens for b in self.buckets],
            "cached_tokens": [b.cached_tokens for b in self.buckets],
            "completion_tokens": [b.completion_tokens for b in self.buckets],
            "cost_micro": [b.cost_micro for b in self.buckets],
            "savings_micro": [b.savings_micro for b in self.buckets],
        }

    def _backends(self, live: Live) -> list[dict[str, Any]]:
        """Every backend with records in the window or in the live view, by id."""
        current = {b.backend_id: b for b in live.backends}
        rows = []
        for backend_id in sorted(set(self.by_backend) | set(current)):
            now = current.get(backend_id)
            rows.append({
                "backend_id": backend_id,
                "region": now.region if now is not None else self.backend_region.get(backend_id),
                **self.by_backend.get(backend_id, Tally()).to_json(),
                "healthy": None if now is None else now.healthy,
                "inflight_prefill": None if now is None else now.inflight_prefill,
                "inflight_decode": None if now is None else now.inflight_decode,
                "reports_cached_tokens": None if now is None else now.reports_cached_tokens,
                "billing_problem": None if now is None else now.billing_problem,
                "kv_tier_hit_blocks": None if now is None else now.kv_tier_hit_blocks,
            })
        return rows
