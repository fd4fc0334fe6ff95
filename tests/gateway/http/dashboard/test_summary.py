"""The dashboard's aggregation: pure functions over ledger records."""

from __future__ import annotations

import pytest

from gateway.http.dashboard.summary import (
    MAX_BUCKETS,
    BackendLive,
    ErrorCount,
    Live,
    Samples,
    UsageSummary,
    Window,
    percentile,
)
from tests.gateway.http.dashboard.records import record

T0 = 1_800_000_000.0


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 90) == 90.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_automatic_buckets_keep_the_series_short() -> None:
    assert Window.auto(T0, T0 + 3600).bucket_s == 30  # 120 points
    assert Window.auto(T0, T0 + 900).bucket_s == 10
    assert Window.auto(T0, T0 + 7 * 86_400).bucket_s == 6 * 3600
    assert Window.auto(T0, T0 + 3600, 300).num_buckets == 12
    assert Window.auto(T0, T0 + 61, 60).num_buckets == 2  # a partial last bucket counts
    with pytest.raises(ValueError, match="after"):
        Window.auto(T0, T0)
    with pytest.raises(ValueError, match="buckets"):
        Window(T0, T0 + (MAX_BUCKETS + 1), 1)


def test_totals_series_and_groups() -> None:
    window = Window(T0, T0 + 300, 60)
    summary = UsageSummary(window)
    summary.add(record("r1", T0 + 10, cost_micro=70, ttft_s=0.1, itl_s=0.02), 30)
    summary.add(record("r2", T0 + 70, backend_id="b2", region="far", cached_tokens=0, cost_micro=90), 0)
    summary.add(record("r3", T0 + 299, status="cancelled", completion_tokens=3, cost_micro=5, ttft_s=0.3), None)
    summary.add(record("r4", T0 + 130, tenant_id="other", status="backend_error", backend_id=None, region=None))
    body = summary.to_json(tenant=None, is_admin=True)

    totals = body["totals"]
    assert totals["requests"] == 4
    assert totals["prompt_tokens"] == 400 and totals["cached_tokens"] == 120
    assert totals["completion_tokens"] == 33 and totals["total_tokens"] == 433
    assert totals["cost_micro"] == 165 and totals["savings_micro"] == 30
    assert totals["hit_ratio"] == pytest.approx(0.3)
    assert totals["failed"] == 2
    assert body["statuses"] == {"ok": 2, "cancelled": 1, "backend_error": 1, "rejected": 0, "cached": 0}

    series = body["series"]
    assert series["t"] == [T0, T0 + 60, T0 + 120, T0 + 180, T0 + 240]
    assert series["requests"] == [1, 1, 1, 0, 1]
    assert series["cost_micro"] == [70, 90, 0, 0, 5]
    assert series["savings_micro"] == [30, 0, 0, 0, 0]

    backends = {b["backend_id"]: b for b in body["backends"]}
    assert set(backends) == {"b1", "b2"}
    assert backends["b1"]["requests"] == 2 and backends["b1"]["hit_ratio"] == pytest.approx(0.4)
    assert backends["b2"]["region"] == "far" and backends["b2"]["hit_ratio"] == 0
    assert backends["b1"]["healthy"] is None  # no live view given
    assert [r["region"] for r in body["regions"]] == ["far", "local"]
    assert {t["tenant_id"]: t["requests"] for t in body["tenants"]} == {"acme": 3, "other": 1}

    assert body["latency"]["ttft_s"] == {"count": 2, "p50": 0.1, "p90": 0.3, "p99": 0.3}
    assert body["latency"]["itl_s"] == {"count": 1, "p50": 0.02, "p90": 0.02, "p99": 0.02}
    assert body["errors_by_code"] is None


def test_an_empty_window_has_no_ratios_or_percentiles() -> None:
    body = UsageSummary(Window(T0, T0 + 60, 60)).to_json(tenant="acme", is_admin=False)
    assert body["totals"]["requests"] == 0 and body["totals"]["hit_ratio"] is None
    assert body["latency"]["ttft_s"] == {"count": 0, "p50": None, "p90": None, "p99": None}
    assert body["scope"] == {"tenant": "acme", "admin": False}
    assert body["backends"] == [] and body["series"]["requests"] == [0]


def test_live_figures_join_the_ledger_by_backend() -> None:
    summary = UsageSummary(Window(T0, T0 + 60, 60))
    summary.add(record("r1", T0 + 1))
    live = Live(
        backends=(BackendLive("b1", "local", True, 5, 7, kv_tier_hit_blocks={"host": 3, "region": 62}),
                  BackendLive("idle", "far", False, 0, 0)),
        errors=(ErrorCount(3040, 429, 2),),
    )
    body = summary.to_json(live, tenant=None, is_admin=True)
    rows = {b["backend_id"]: b for b in body["backends"]}
    assert rows["b1"]["requests"] == 1 and rows["b1"]["inflight_prefill"] == 5 and rows["b1"]["healthy"] is True
    assert rows["idle"]["requests"] == 0 and rows["idle"]["healthy"] is False and rows["idle"]["region"] == "far"
    assert rows["b1"]["kv_tier_hit_blocks"] == {"host": 3, "region": 62} and rows["idle"]["kv_tier_hit_blocks"] is None
    assert body["errors_by_code"] == [{"code": 3040, "status": 429, "count": 2}]


def test_samples_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.http.dashboard.summary.MAX_SAMPLES", 100)
    samples = Samples()
    for i in range(10_000):
        samples.add(float(i))
    assert samples.count == 10_000 and len(samples.values) == 100
    p50 = samples.to_json()["p50"]
    assert 2_000 < p50 < 8_000  # a uniform sample's median lands near the middle


def test_an_answer_from_the_response_cache_is_no_failure() -> None:
    summary = UsageSummary(Window(T0, T0 + 300, 60))
    summary.add(record("r1", T0 + 10))
    summary.add(record("r2", T0 + 20, status="cached", prompt_tokens=0, cached_tokens=0, completion_tokens=0,
                       cost_micro=0, backend_id=None, region=None))
    body = summary.to_json(tenant=None, is_admin=True)
    assert body["statuses"]["cached"] == 1 and body["totals"]["failed"] == 0 and body["totals"]["requests"] == 2
