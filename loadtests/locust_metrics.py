"""Custom Locust metrics: TTFT, inter-token latency, cached-token ratio and errors by code.

Locust's statistics only know "requests" with a response time, so each custom metric is fired
as a request event of its own type, and shows up as its own row in the CSV, HTML and console:

    type    name                 response_time
    TTFT    <user kind>          ms from sending to the first text chunk
    ITL     <user kind>          ms between two consecutive text chunks (one event per gap)
    CACHE   cached_tokens_pct    100 x cached / prompt tokens of one request (0..100)
    ERROR   <Workers AI code>    a failure event per error, named by its code (e.g. "3040")

The request row itself ("POST <user kind>") carries the end-to-end time of the whole answer.
Token totals per tenant (prompt, cached, completion) are also kept in `RunTotals`, from which
the summary JSON reports the aggregate cached-token ratio (sum of cached / sum of prompt).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from locust.env import Environment

from loadtests.tenants import TenantKey
from loadtests.workers_ai import Usage, WorkersAIError


@dataclass(slots=True)
class TenantTotals:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    @property
    def cached_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(slots=True)
class RunTotals:
    """What one Locust process saw: tenants' keys, usage per tenant, errors per code."""

    tenants: list[TenantKey] = field(default_factory=list)
    by_tenant: dict[str, TenantTotals] = field(default_factory=dict)
    errors: Counter[int] = field(default_factory=Counter)

    def add_usage(self, tenant: str, usage: Usage) -> None:
        totals = self.by_tenant.setdefault(tenant, TenantTotals())
        totals.requests += 1
        totals.prompt_tokens += usage.prompt_tokens
        totals.cached_tokens += usage.cached_tokens
        totals.completion_tokens += usage.completion_tokens

    def summary(self) -> dict[str, Any]:
        total = TenantTotals()
        for t in self.by_tenant.values():
            total.requests += t.requests
            total.prompt_tokens += t.prompt_tokens
            total.cached_tokens += t.cached_tokens
            total.completion_tokens += t.completion_tokens
        return {
            "tenants": [k.name for k in self.tenants],
            "requests_with_usage": total.requests,
            "prompt_tokens": total.prompt_tokens,
            "cached_tokens": total.cached_tokens,
            "completion_tokens": total.completion_tokens,
            "cached_token_ratio": total.cached_ratio,
            "by_tenant": {name: {**asdict(t), "cached_ratio": t.cached_ratio} for name, t in self.by_tenant.items()},
            "errors_by_code": {str(code): n for code, n in sorted(self.errors.items())},
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.summary(), indent=2))


def _fire(environment: Environment, request_type: str, name: str, ms: float, *, length: int = 0,
          exception: Exception | None = None) -> None:
    environment.events.request.fire(
        request_type=request_type,
        name=name,
        response_time=ms,
        response_length=length,
        exception=exception,
        context={},
        start_time=time.time(),
        url=None,
        response=None,
    )


def report_stream(environment: Environment, kind: str, ttft_s: float | None, itls_s: list[float]) -> None:
    """TTFT and one ITL event per gap between text chunks."""
    if ttft_s is not None:
        _fire(environment, "TTFT", kind, ttft_s * 1000)
    for gap in itls_s:
        _fire(environment, "ITL", kind, gap * 1000)


def report_usage(environment: Environment, totals: RunTotals, tenant: str, usage: Usage) -> None:
    totals.add_usage(tenant, usage)
    pct = 100.0 * usage.cached_tokens / usage.prompt_tokens if usage.prompt_tokens else 0.0
    _fire(environment, "CACHE", "cached_tokens_pct", pct, length=usage.cached_tokens)


def report_error(environment: Environment, totals: RunTotals, error: WorkersAIError) -> None:
    totals.errors[error.code] += 1
    _fire(environment, "ERROR", str(error.code), 0.0, exception=error)
