"""One load level's requests -> the numbers a serving benchmark reports.

- TTFT: request sent -> first text chunk. TPOT: (end-to-end - TTFT) / (completion tokens - 1),
  per request. ITL: every gap between consecutive chunks, pooled over all requests. E2E: sent ->
  [DONE]. Percentiles are p50/p90/p99 (linear interpolation) over successful requests.
- Throughput: requests and tokens completed per second of the level's wall time (its first
  send to its last answer).
- Goodput: successful requests per second that met the SLO (TTFT <= slo.ttft_s and, for
  answers of two tokens or more, TPOT <= slo.tpot_s); attainment is their share of all requests.
- Cached-token ratio: cached prompt tokens / prompt tokens, summed over successful requests
  (the gateway's usage, which is what a tenant is billed at the discount).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from loadtests.bench.client import RequestRecord


@dataclass(frozen=True, slots=True)
class SLO:
    ttft_s: float = 2.0
    tpot_s: float = 0.25

    def met_by(self, record: RequestRecord) -> bool:
        if not record.ok or record.ttft_s is None or record.ttft_s > self.ttft_s:
            return False
        return record.tpot_s is None or record.tpot_s <= self.tpot_s


@dataclass(frozen=True, slots=True)
class Percentiles:
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, values: Sequence[float]) -> Percentiles:
        if not values:
            return cls(None, None, None)
        p50, p90, p99 = np.percentile(np.asarray(values, dtype=float), [50, 90, 99])
        return cls(float(p50), float(p90), float(p99))


@dataclass(frozen=True, slots=True)
class LevelSummary:
    policy: str
    workload: str
    load: str  # e.g. "concurrency 2"
    load_value: float
    num_requests: int
    num_ok: int
    errors_by_code: dict[str, int]
    duration_s: float
    request_throughput: float  # successful requests / s
    output_token_throughput: float  # completion tokens / s
    total_token_throughput: float  # prompt + completion tokens / s
    ttft_s: Percentiles
    tpot_s: Percentiles
    itl_s: Percentiles
    e2e_s: Percentiles
    goodput: float  # requests / s meeting the SLO
    slo_attainment: float  # share of all requests meeting the SLO
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def cached_token_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def summarize(records: Sequence[RequestRecord], *, policy: str, workload: str, load: str, load_value: float,
              slo: SLO) -> LevelSummary:
    ok = [r for r in records if r.ok]
    if records:
        duration = max(r.end_s for r in records) - min(r.start_s for r in records)
    else:
        duration = 0.0
    per_s = 1.0 / duration if duration > 0 else 0.0
    prompt = sum(r.prompt_tokens for r in ok)
    completion = sum(r.completion_tokens for r in ok)
    good = sum(1 for r in records if slo.met_by(r))
    return LevelSummary(
        policy=policy,
        workload=workload,
        load=load,
        load_value=load_value,
        num_requests=len(records),
        num_ok=len(ok),
        errors_by_code={str(code): n for code, n in sorted(Counter(r.error_code for r in records if not r.ok).items())},
        duration_s=duration,
        request_throughput=len(ok) * per_s,
        output_token_throughput=completion * per_s,
        total_token_throughput=(prompt + completion) * per_s,
        ttft_s=Percentiles.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_s=Percentiles.of([r.tpot_s for r in ok if r.tpot_s is not None]),
        itl_s=Percentiles.of([gap for r in ok for gap in r.itls_s]),
        e2e_s=Percentiles.of([r.e2e_s for r in ok if r.e2e_s is not None]),
        goodput=good * per_s,
        slo_attainment=good / len(records) if records else 0.0,
        prompt_tokens=prompt,
        cached_tokens=sum(r.cached_tokens for r in ok),
        completion_tokens=completion,
    )
