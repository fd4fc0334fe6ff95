"""The dashboard in a real browser (Chromium from Debian, driven by Playwright) against a real
gateway and backends: log in, read the numbers, change the range and tenant, watch it refresh.

A known workload goes through the gateway first (two tenants, real generations); the page's
figures must equal the sums of the ledger's rows. Without Chromium or Playwright the tests skip,
except under CI=true, where they fail (`make test` installs both).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.billing.prices import PriceHistory, default_prices
from gateway.billing.recompute import reprice
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.store.models import UsageRecord
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, InProcessGateway
from tests.gateway.http.dashboard.records import record

pytestmark = pytest.mark.slow
CHROMIUM_PATHS = ("/usr/lib/chromium/chromium", "/usr/bin/chromium", "/usr/bin/chromium-browser")
WAIT_MS = 10_000


def chromium_path() -> str:
    found = next((p for p in CHROMIUM_PATHS if os.access(p, os.X_OK)), None) or shutil.which("chromium")
    missing = None
    if found is None:
        missing = "Chromium is not installed (apt-get install chromium; `make test` does it)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "Playwright for Python is not installed (the [test] extra has it)"
    if missing is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(missing + " (CI=true: the browser tests must run)")
        pytest.skip(missing)
    assert found is not None
    return found


def run(gw: InProcessGateway, tenant: str, secret: str, prompt: str, *, stream: bool = False) -> None:
    url = f"{gw.url}/client/v4/accounts/acc-{tenant}/ai/run/{DEFAULT_MODEL_ID}"
    body = {"prompt": prompt, "max_tokens": 4, "stream": stream}
    answer = httpx.post(url, json=body, headers={"authorization": f"Bearer {secret}"}, timeout=60)
    assert answer.status_code == 200, answer.text


def ledger(gw: InProcessGateway, tenant: str | None, since_s: float) -> list[UsageRecord]:
    assert gw.store is not None
    store = gw.store

    async def read() -> list[UsageRecord]:
        now = time.time()
        return [r async for r in store.ledger.iter_usage(now - since_s, now + 60, tenant)]

    return gw.call(read())


@pytest.fixture(scope="module")
def workload(gateway: InProcessGateway) -> Iterator[dict[str, str]]:
    """Two tenants with known traffic: dash-a three requests (one streamed, a repeated prompt for
    the prefix cache) plus one 2-day-old ledger row; dash-b one request."""
    keys = {tenant: gateway.new_key(tenant, f"acc-{tenant}") for tenant in ("dash-a", "dash-b")}
    prompt = "Describe the dashboard of a small sailing boat in one sentence, please, briefly."
    run(gateway, "dash-a", keys["dash-a"], prompt)
    run(gateway, "dash-a", keys["dash-a"], prompt, stream=True)
    run(gateway, "dash-a", keys["dash-a"], "Name a colour.")
    run(gateway, "dash-b", keys["dash-b"], "Name a fruit.")
    assert gateway.store is not None
    old = record("dash-a-old", time.time() - 2 * 86_400, tenant_id="dash-a", account_id="acc-dash-a", cost_micro=123)
    assert gateway.call(gateway.store.ledger.append(old))
    yield keys


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        args = ["--no-sandbox", "--disable-dev-shm-usage"]  # root in a container: no sandbox, a small /dev/shm
        launched = p.chromium.launch(executable_path=path, headless=True, args=args)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()
    opened = context.new_page()
    problems: list[str] = []
    refused = ("status of 401", "status of 403")  # what the tests provoke on purpose

    def on_console(message: Any) -> None:
        if message.type == "error" and not any(r in message.text for r in refused):
            problems.append(message.text)

    opened.on("console", on_console)
    opened.on("pageerror", lambda e: problems.append(str(e)))
    yield opened
    context.close()
    assert not problems, f"the page logged errors (a CSP violation is one): {problems}"


def log_in(page: Any, gw: InProcessGateway, token: str) -> None:
    page.goto(f"{gw.url}/dashboard")
    page.fill("#token", token)
    page.click("#login button[type=submit]")
    # Functions, not bare expressions: Playwright evaluates those with eval, which the page's CSP refuses.
    page.wait_for_function("() => Number(document.getElementById('updated').dataset.loads) >= 1", timeout=WAIT_MS)


def show(page: Any, *, range_s: str | None = None, tenant: str | None = None) -> None:
    """Change the range and/or tenant and wait until the page shows that selection's figures."""
    before = int(page.get_attribute("#updated", "data-loads"))
    if range_s is not None:
        page.select_option("#range", range_s)
    if tenant is not None:
        page.select_option("#tenant", tenant)
    page.wait_for_function(
        "([n, r, t]) => { const d = document.getElementById('updated').dataset;"
        " return Number(d.loads) > n && d.range === r && d.tenant === t; }",
        arg=[before, page.input_value("#range"), page.input_value("#tenant")],
        timeout=WAIT_MS,
    )


def kpis(page: Any) -> dict[str, str]:
    ids = ("requests", "prompt-tokens", "cached-tokens", "cached-share", "completion-tokens", "spend", "saved", "failed")
    return {name: page.text_content(f"#kpi-{name}") for name in ids}


def expected(records: list[UsageRecord]) -> dict[str, str]:
    """The KPI texts the ledger's rows call for (savings re-priced as the billing export does)."""
    history = PriceHistory.from_config(default_prices())  # what the session gateway is configured with
    prompt, cached = sum(r.prompt_tokens for r in records), sum(r.cached_tokens for r in records)
    saved = 0
    for r in records:
        charge = reprice(r, history)
        assert charge is not None
        saved += charge.savings_micros
    return {
        "requests": str(len(records)),
        "prompt-tokens": str(prompt),
        "cached-tokens": str(cached),
        "cached-share": f"{cached / prompt * 100:.1f}%",
        "completion-tokens": str(sum(r.completion_tokens for r in records)),
        "spend": f"${sum(r.cost_micro for r in records) / 1e6:.6f}",
        "saved": f"${saved / 1e6:.6f}",
        "failed": str(sum(r.status != "ok" for r in records)),
    }


def test_the_admin_sees_the_ledger_and_changes_range_and_tenant(
    gateway: InProcessGateway, workload: dict[str, str], page: Any
) -> None:
    log_in(page, gateway, ADMIN_TOKEN)
    assert page.text_content("#scope") == "admin: every tenant"
    show(page, tenant="dash-a")
    hour = ledger(gateway, "dash-a", 3600)
    assert len(hour) == 3 and sum(r.cached_tokens for r in hour) > 0  # the repeated prompt hit the cache
    assert kpis(page) == expected(hour)
    assert page.locator("#chart-requests canvas").count() == 1
    assert page.locator("#tenants tbody tr td").all_text_contents()[:4] == [
        "dash-a", "3", str(sum(r.prompt_tokens + r.completion_tokens for r in hour)),
        f"${sum(r.cost_micro for r in hour) / 1e6:.6f}",
    ]
    ttft = sorted(r.ttft_s for r in hour if r.ttft_s is not None)
    assert len(ttft) == 3  # every generation recorded its time to first token
    first_row = page.locator("#latency tbody tr").first.locator("td").all_text_contents()
    assert first_row == ["time to first token", *(f"{ttft[i] * 1000:.1f} ms" for i in (1, 2, 2)), "3"]  # nearest rank

    show(page, range_s="604800")  # the last 7 days include the 2-day-old row
    week = ledger(gateway, "dash-a", 7 * 86_400)
    assert len(week) == 4 and kpis(page) == expected(week)

    show(page, tenant="")  # every tenant: dash-b's request too
    assert page.text_content("#kpi-requests") == str(len(ledger(gateway, None, 7 * 86_400)))
    tenants = page.locator("#tenants tbody tr td:first-child").all_text_contents()
    assert {"dash-a", "dash-b"} <= set(tenants)


def test_live_refresh_shows_a_new_request(gateway: InProcessGateway, workload: dict[str, str], page: Any) -> None:
    log_in(page, gateway, ADMIN_TOKEN)
    show(page, tenant="dash-b")
    assert page.text_content("#kpi-requests") == str(len(ledger(gateway, "dash-b", 3600)))
    run(gateway, "dash-b", workload["dash-b"], "Name a vegetable.")
    page.wait_for_function(  # no click: the live refresh (every 5 s) picks it up
        "(n) => document.getElementById('kpi-requests').textContent === n",
        arg=str(len(ledger(gateway, "dash-b", 3600))),
        timeout=WAIT_MS,
    )


def test_a_tenant_key_sees_only_its_tenant(gateway: InProcessGateway, workload: dict[str, str], page: Any) -> None:
    log_in(page, gateway, workload["dash-b"])
    assert page.text_content("#scope") == "tenant dash-b"
    assert page.is_disabled("#tenant")
    assert kpis(page) == expected(ledger(gateway, "dash-b", 3600))
    assert page.locator("#tenants tbody tr td:first-child").all_text_contents() == ["dash-b"]
    assert page.is_hidden("#errors")  # gateway-wide errors are the operator's
    # The same key asking the API for another tenant from this page is refused.
    status = page.evaluate(
        "async (key) => (await fetch('/dashboard/api/usage?tenant=dash-a',"
        " {headers: {Authorization: 'Bearer ' + key}})).status",
        workload["dash-b"],
    )
    assert status == 403
    assert page.evaluate("sessionStorage.getItem('edgerun.dashboard.token')") == workload["dash-b"]

    page.click("#logout")
    assert page.is_visible("#login") and page.evaluate("sessionStorage.length") == 0


def test_a_wrong_token_is_refused_on_the_page(gateway: InProcessGateway, page: Any) -> None:
    page.goto(f"{gateway.url}/dashboard")
    page.fill("#token", "not-a-token")
    page.click("#login button[type=submit]")
    page.wait_for_selector("#error:not([hidden])", timeout=WAIT_MS)
    assert "Authentication error" in page.text_content("#error")
    assert page.is_hidden("#main")
