from __future__ import annotations

import pytest

from loadtests.bench.client import RequestRecord
from loadtests.bench.metrics import SLO, Percentiles, summarize


def record(start: float, ttft: float, e2e: float, completion: int, prompt: int = 100, cached: int = 0,
           error: int | None = None) -> RequestRecord:
    tpot = (e2e - ttft) / (completion - 1) if completion > 1 else None
    return RequestRecord("agent", "acme", "s", start, ttft_s=ttft, tpot_s=tpot, e2e_s=e2e,
                         itls_s=[tpot] * (completion - 1) if tpot else [], prompt_tokens=prompt, cached_tokens=cached,
                         completion_tokens=completion, error_code=error)


def test_percentiles() -> None:
    p = Percentiles.of([float(i) for i in range(1, 101)])
    assert (p.p50, p.p90, p.p99) == pytest.approx((50.5, 90.1, 99.01))
    assert Percentiles.of([]) == Percentiles(None, None, None)


def test_summary_throughput_goodput_and_cache() -> None:
    records = [
        record(0.0, 0.5, 1.5, 11, cached=50),  # tpot 0.1: meets the SLO
        record(1.0, 3.0, 4.0, 11, cached=100),  # ttft too slow
        record(2.0, 0.2, 4.2, 11, cached=0),  # tpot 0.4: too slow
        RequestRecord("agent", "acme", "s", 3.0, e2e_s=1.0, error_code=3040, error_message="busy"),
    ]
    s = summarize(records, policy="p", workload="agent", load="concurrency 2", load_value=2, slo=SLO(2.0, 0.25))
    assert s.duration_s == pytest.approx(6.2)  # first send at 0.0, last answer at 2.0 + 4.2
    assert (s.num_requests, s.num_ok, s.errors_by_code) == (4, 3, {"3040": 1})
    assert s.request_throughput == pytest.approx(3 / 6.2)
    assert s.output_token_throughput == pytest.approx(33 / 6.2)
    assert s.goodput == pytest.approx(1 / 6.2)
    assert s.slo_attainment == pytest.approx(0.25)
    assert s.cached_token_ratio == pytest.approx(150 / 300)
    assert s.ttft_s.p50 == pytest.approx(0.5)
    assert s.itl_s.p50 == pytest.approx(0.1)


def test_an_empty_level() -> None:
    s = summarize([], policy="p", workload="agent", load="rate 1/s", load_value=1, slo=SLO())
    assert s.num_requests == 0 and s.request_throughput == 0 and s.cached_token_ratio == 0
