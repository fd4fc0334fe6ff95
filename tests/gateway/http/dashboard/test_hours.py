"""The dashboard from the ledger's hourly sums (gateway/store/ledger.py `hours`): the whole hours of a
window come from the sums, the rest record by record, and the answer is the one a scan of every
record gives, on the local store and on Redis (issue 36: a 93-day query read 200k records)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.billing.prices import DEFAULT_PRICE_VERSION, PriceHistory, default_prices
from gateway.billing.savings import savings
from gateway.http.dashboard.api import summarize
from gateway.http.dashboard.summary import UsageSummary, Window
from gateway.settings import GatewaySettings
from gateway.store import Store, UsageRecord, open_store
from gateway.store.ledger import HOUR_S
from tests.gateway.http.dashboard.records import record

T0 = 1_800_000_000.0  # a whole hour (and day): 2027-01-15 08:00 UTC
HISTORY = PriceHistory.from_config(default_prices(), {})


def test_a_window_splits_into_whole_hours_and_stretches_around_them() -> None:
    window = Window(T0 - 1800, T0 + 3 * HOUR_S + 60, 86_400)  # starts half an hour before T0, one bucket
    whole, stretches = window.split(0)
    assert whole == [T0, T0 + HOUR_S, T0 + 2 * HOUR_S]
    assert stretches == [(T0 - 1800, T0), (T0 + 3 * HOUR_S, T0 + 3 * HOUR_S + 60)]
    # an hour across a bucket boundary is read record by record; so is one before `since`
    buckets = Window(T0 - 1800, T0 + 3 * HOUR_S + 60, HOUR_S)
    assert buckets.split(0)[0] == [] and buckets.split(0)[1] == [(T0 - 1800, T0 + 3 * HOUR_S + 60)]
    assert window.split(int(T0 + HOUR_S)) == ([T0 + HOUR_S, T0 + 2 * HOUR_S],
                                              [(T0 - 1800, T0 + HOUR_S), (T0 + 3 * HOUR_S, T0 + 3 * HOUR_S + 60)])
    assert Window(T0 + 10, T0 + 70, 10).split(0) == ([], [(T0 + 10, T0 + 70)])  # shorter than an hour


def records(n: int) -> list[UsageRecord]:
    """`n` records over four days, every field the dashboard groups or sums varied."""
    rng = random.Random(7)
    made = []
    for i in range(n):
        prompt = rng.randint(1, 5000)
        backend = rng.choice(("b1", "b2", None))
        status = rng.choice(("ok", "ok", "ok", "cancelled", "backend_error", "rejected"))
        made.append(record(
            f"r{i}", T0 + rng.random() * 4 * 86_400, tenant_id=rng.choice(("acme", "other")),
            backend_id=backend, region={"b1": "eu", "b2": "us", None: None}[backend], status=status,
            prompt_tokens=prompt, cached_tokens=rng.randint(0, prompt), completion_tokens=rng.randint(0, 300),
            price_version=rng.choice((DEFAULT_PRICE_VERSION, "unpriced", "gone")), cost_micro=rng.randint(0, 999),
            ttft_s=rng.choice((None, round(rng.random(), 6))), itl_s=rng.choice((None, round(rng.random() / 20, 6))),
        ))
    return made


@pytest.fixture(params=["local", "redis"])
async def filled(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[Store, list[UsageRecord]]]:
    if request.param == "redis":
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
        settings = GatewaySettings(redis_url=url, key_prefix=prefix)
        import redis

        with redis.Redis.from_url(url) as client:  # a ledger that kept sums from its first record
            client.set(f"{prefix}usage_hours_since", 0)
    else:
        settings = GatewaySettings(redis_url=None, sqlite_path=str(tmp_path / "g.sqlite3"))
    store = open_store(settings.store, lambda r: savings(r, HISTORY))
    made = records(600)
    for r in made:
        assert await store.ledger.append(r)
    yield store, made
    await store.aclose()


@pytest.mark.parametrize(
    ("start", "end", "bucket"),
    [
        (T0 - 86_400, T0 + 5 * 86_400, None),  # whole days: every hour from the sums
        (T0 + 1234.5, T0 + 3 * 86_400 + 77, 21_600),  # ragged ends, 6-hour buckets
        (T0 + 3600 * 5 + 10, T0 + 3600 * 7, 30),  # small buckets: all records
    ],
)
@pytest.mark.parametrize("tenant", [None, "acme"])
async def test_the_summary_from_hourly_sums_is_the_one_from_every_record(
    filled: tuple[Store, list[UsageRecord]], start: float, end: float, bucket: float | None, tenant: str | None
) -> None:
    store, made = filled
    window = Window.auto(start, end, bucket)
    scanned = UsageSummary(window)
    for r in sorted(made, key=lambda r: (r.ended_us, r.request_id)):
        if start <= r.ended_at < end and tenant in (None, r.tenant_id):
            scanned.add(r, savings(r, HISTORY))
    summed = await summarize(store.ledger, window, tenant, HISTORY)
    assert summed.to_json(tenant=tenant, is_admin=True) == scanned.to_json(tenant=tenant, is_admin=True)
    assert summed.totals.requests > 0
