"""The dashboard's JSON API over HTTP: who may see what, the numbers of known ledger rows, and what
a tenant's key may spend on it (its requests per minute, concurrent queries).

A real gateway (in-process, on a loopback port, no backends needed) with records written to its
ledger through the store; the browser test (test_browser.py) drives real requests end to end.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.billing.prices import DEFAULT_PRICE_VERSION
from gateway.http.dashboard.limits import TenantQueries
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, InProcessGateway, gateway_settings
from tests.gateway.http.dashboard.records import record

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def dash(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[InProcessGateway, dict[str, str]]]:
    started = InProcessGateway(gateway_settings(tmp_path_factory.mktemp("dash"), [])).start()
    assert started.store is not None
    keys = {tenant: started.new_key(tenant, f"acc-{tenant}") for tenant in ("acme", "other")}
    now = time.time()
    rows = [
        # 1M cached of 2M prompt tokens at the default price: input $0.027/M, cached $0.0045/M, output $0.201/M
        record("a1", now - 60, prompt_tokens=2_000_000, cached_tokens=1_000_000, completion_tokens=1000,
               price_version=DEFAULT_PRICE_VERSION, cost_micro=31_701, ttft_s=0.25, itl_s=0.02),
        record("a2", now - 120, status="cancelled", ttft_s=0.5),
        record("a-old", now - 3 * 86_400),  # outside the default hour
        record("o1", now - 30, tenant_id="other", account_id="acc-other", backend_id="b2", region="far"),
    ]
    for row in rows:
        assert started.call(started.store.ledger.append(row))
    yield started, keys
    started.stop()


def get(gw: InProcessGateway, path: str, headers: dict[str, str], **params: Any) -> httpx.Response:
    return httpx.get(f"{gw.url}{path}", params=params, headers=headers, timeout=10)


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


def test_no_token_or_a_wrong_one_is_401(dash: tuple[InProcessGateway, dict[str, str]]) -> None:
    gw, _ = dash
    for headers in ({}, bearer("wrong"), {"authorization": "Basic abc"}):
        answer = get(gw, "/dashboard/api/usage", headers)
        assert answer.status_code == 401
        assert answer.json()["success"] is False and answer.json()["errors"][0]["code"] == 10000


def test_the_admin_sees_every_tenant_and_may_filter(dash: tuple[InProcessGateway, dict[str, str]]) -> None:
    gw, _ = dash
    body = get(gw, "/dashboard/api/usage", ADMIN).json()
    assert body["scope"] == {"tenant": None, "admin": True}
    assert body["totals"]["requests"] == 3  # the 3-day-old row is outside the default hour
    assert {t["tenant_id"] for t in body["tenants"]} == {"acme", "other"}
    assert body["totals"]["savings_micro"] == 22_500  # 1M cached tokens x ($0.027 - $0.0045) / M
    assert body["totals"]["cost_micro"] == 31_701
    assert body["statuses"]["cancelled"] == 1 and body["totals"]["failed"] == 1
    assert body["latency"]["ttft_s"]["count"] == 2 and body["latency"]["ttft_s"]["p50"] == 0.25
    assert isinstance(body["errors_by_code"], list)  # the operator's view includes errors by code

    acme = get(gw, "/dashboard/api/usage", ADMIN, tenant="acme").json()
    assert acme["totals"]["requests"] == 2 and [t["tenant_id"] for t in acme["tenants"]] == ["acme"]
    week = get(gw, "/dashboard/api/usage", ADMIN, tenant="acme", **{"from": time.time() - 7 * 86_400}).json()
    assert week["totals"]["requests"] == 3
    listed = get(gw, "/dashboard/api/tenants", ADMIN).json()
    assert listed["admin"] is True and {t["id"] for t in listed["tenants"]} >= {"acme", "other"}


def test_a_tenant_key_sees_its_own_tenant_only(dash: tuple[InProcessGateway, dict[str, str]]) -> None:
    gw, keys = dash
    own = get(gw, "/dashboard/api/usage", bearer(keys["other"])).json()
    assert own["scope"] == {"tenant": "other", "admin": False}
    assert own["totals"]["requests"] == 1 and [t["tenant_id"] for t in own["tenants"]] == ["other"]
    assert [b["backend_id"] for b in own["backends"]] == ["b2"]
    assert own["errors_by_code"] is None  # the gateway-wide figures are the operator's
    assert get(gw, "/dashboard/api/usage", bearer(keys["other"]), tenant="other").status_code == 200

    refused = get(gw, "/dashboard/api/usage", bearer(keys["other"]), tenant="acme")
    assert refused.status_code == 403 and refused.json()["errors"][0]["code"] == 10000
    listed = get(gw, "/dashboard/api/tenants", bearer(keys["acme"])).json()
    assert listed == {"admin": False, "tenants": [{"id": "acme", "name": "acme"}]}


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"from": "yesterday"}, "from"),
        ({"from": "2026-11-02", "to": "2026-11-01"}, "from"),
        ({"from": "2026-01-01", "to": "2026-12-01"}, "from"),
        ({"bucket": "abc"}, "bucket"),
        ({"bucket": "0.5"}, "bucket"),
        ({"bucket": "1e-310"}, "bucket"),  # so small that span / bucket overflows: was a 500
        ({"bucket": "nan"}, "bucket"),
        ({"tenant": "has space"}, "tenant"),
        ({"to": "1e15"}, "to"),  # past 64-bit microseconds: the store's query overflowed (500)
        ({"from": "-1e15", "to": "0"}, "from"),
        ({"from": "0001-01-01", "to": "0001-01-02"}, "from"),
        ({"to": "inf"}, "to"),
    ],
)
def test_bad_queries_get_400_naming_the_parameter(
    dash: tuple[InProcessGateway, dict[str, str]], params: dict[str, str], param: str
) -> None:
    gw, _ = dash
    answer = get(gw, "/dashboard/api/usage", ADMIN, **params)
    assert answer.status_code == 400, answer.text
    assert answer.json()["errors"][0]["code"] == 5004 and param in answer.json()["errors"][0]["message"]


def test_times_outside_the_storable_range_are_400_not_500(dash: tuple[InProcessGateway, dict[str, str]]) -> None:
    gw, _ = dash
    for params, name in (({"to": "1e15"}, "to"), ({"from": "-5", "to": "10"}, "from")):
        answer = get(gw, "/dashboard/api/usage", ADMIN, **params)
        assert answer.status_code == 400, answer.text
        message = answer.json()["errors"][0]["message"]
        assert message.startswith(f"{name}=") and "1970-01-01 to 9999-12-31" in message
    edge = get(gw, "/dashboard/api/usage", ADMIN, **{"from": "253402297200", "to": "253402300799"})
    assert edge.status_code == 200 and edge.json()["totals"]["requests"] == 0


def test_a_keys_dashboard_calls_count_against_its_requests_per_minute(
    dash: tuple[InProcessGateway, dict[str, str]],
) -> None:
    gw, _ = dash
    key = bearer(gw.new_key("acme", "acc-acme", rpm=2))
    assert get(gw, "/dashboard/api/tenants", key).status_code == 200
    assert get(gw, "/dashboard/api/usage", key).status_code == 200
    refused = get(gw, "/dashboard/api/usage", key)
    assert refused.status_code == 429 and refused.json()["errors"][0]["code"] == 3040
    assert "2 requests per minute" in refused.text and float(refused.headers["retry-after"]) > 0
    inference = httpx.post(f"{gw.url}/client/v4/accounts/acc-acme/ai/run/@cf/any", json={}, headers=key, timeout=10)
    assert inference.status_code == 429 and "Rate limited" in inference.text  # one window for both
    assert get(gw, "/dashboard/api/usage", ADMIN).status_code == 200  # the admin token is no key


def test_a_tenant_runs_a_bounded_number_of_usage_queries_at_once(dash: tuple[InProcessGateway, dict[str, str]]) -> None:
    gw, keys = dash
    queries: TenantQueries = gw.app.state.dashboard_queries
    held = contextlib.ExitStack()

    async def occupy() -> None:  # as if the tenant's queries were scanning the ledger now
        for _ in range(gw.settings.http.dashboard_max_concurrent_queries):
            held.enter_context(queries.slot("other"))

    async def release() -> None:
        held.close()

    gw.call(occupy())
    try:
        refused = get(gw, "/dashboard/api/usage", bearer(keys["other"]))
        assert refused.status_code == 429 and refused.json()["errors"][0]["code"] == 3040
        assert "dashboard_max_concurrent_queries" in refused.text and refused.headers["retry-after"]
        assert get(gw, "/dashboard/api/usage", bearer(keys["acme"])).status_code == 200  # another tenant's
        assert get(gw, "/dashboard/api/usage", ADMIN, tenant="other").status_code == 200  # the operator's
    finally:
        gw.call(release())
    assert get(gw, "/dashboard/api/usage", bearer(keys["other"])).status_code == 200
    assert queries.running("other") == 0
