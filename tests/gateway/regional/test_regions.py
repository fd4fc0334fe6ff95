"""Two regions 100 ms apart (real gateways, Redis servers and WAN links on loopback): nothing on a
request's path crosses the WAN, tenancy reaches the other region within a second, budgets are never
overspent, and the ledger reaches home once per request, through a cut link and a store restart."""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import Counter
from typing import Any

import httpx
import pytest

from cli.regions import Regions
from tests.gateway.regional.topology import Admin, ask, wait_for

pytestmark = pytest.mark.process

# How long the WAN stays cut while both regions serve. The issue asks for 60 s; the test runs 5 s
# by default to stay fast (what matters, records queued across a dropped and restored link, is the same).
CUT_S = float(os.environ.get("EDGERUN_TEST_WAN_CUT_S", "5"))


def _key(regions: Regions, account: str, **tenant: object) -> tuple[Admin, str, str, str]:
    """A new tenant and key, made at home and usable in both regions: (admin, tenant id, key id, secret)."""
    home, second = regions.regions
    admin = Admin(home.url)
    tenant_id = admin.tenant(account, **tenant)
    key_id, secret = admin.key(tenant_id)
    with httpx.Client(timeout=10) as http:
        wait_for(lambda: ask(http, second.url, account, secret, max_tokens=1).status_code != 401, 2)
    return admin, tenant_id, key_id, secret


def _latencies_ms(http: httpx.Client, bases: list[str], account: str, secret: str, stream: bool, n: int) -> list[list[float]]:
    """`n` requests to each base, one to each in turn (the order alternating), so both see the same machine."""
    times: list[list[float]] = [[] for _ in bases]
    for i in range(n):
        for j in (range(len(bases)) if i % 2 == 0 else reversed(range(len(bases)))):
            start = time.perf_counter()
            answer = ask(http, bases[j], account, secret, stream)
            times[j].append((time.perf_counter() - start) * 1000)
            assert answer.status_code == 200, answer.text
    return times


def test_a_request_in_the_second_region_costs_what_it_costs_at_home(regions: Regions) -> None:
    _, _, _, secret = _key(regions, "latency")
    bases = [region.url for region in regions.regions]
    with httpx.Client(timeout=10) as http:
        _latencies_ms(http, bases, "latency", secret, False, 5)  # warm: connections, tokenizer, route
        for stream in (False, True):
            rounds = [[statistics.median(t) for t in _latencies_ms(http, bases, "latency", secret, stream, 30)]
                      for _ in range(3)]  # fmt: skip
            extra = statistics.median(there - at_home for at_home, there in rounds)  # a loaded machine's bursts
            print(f"stream={stream}: p50 home, region 2 per round: {rounds}")
            assert extra <= 5.0, f"stream={stream}: region 2's p50 {extra:.1f} ms over home's ({rounds})"


def test_a_revoked_key_is_refused_and_a_new_key_accepted_in_the_second_region_within_a_second(regions: Regions) -> None:
    admin, tenant_id, key_id, secret = _key(regions, "tenancy")
    second = regions.regions[1]
    with httpx.Client(timeout=10) as http:
        _, new_secret = admin.key(tenant_id)
        works = wait_for(lambda: ask(http, second.url, "tenancy", new_secret, max_tokens=1).status_code == 200, 1.0)
        admin.revoke(key_id)
        refused = wait_for(lambda: ask(http, second.url, "tenancy", secret, max_tokens=1).status_code == 401, 1.0)
    assert works < 1.0 and refused < 1.0


def test_concurrent_spending_in_both_regions_never_overspends_a_budget(regions: Regions) -> None:
    budget = 1_000_000  # about 30 requests of 36 tokens at 1000 micro-units a token
    admin, tenant_id, _, secret = _key(regions, "budget", monthly_budget_micro=budget)
    outcomes: Counter[tuple[str, int]] = Counter()
    lock = threading.Lock()

    def spend(region: str, base: str) -> None:
        with httpx.Client(timeout=10) as http:
            while True:
                status = ask(http, base, "budget", secret).status_code
                with lock:
                    outcomes[(region, status)] += 1
                if status == 429:
                    return
                assert status == 200

    workers = [threading.Thread(target=spend, args=(r.name, r.url)) for r in regions.regions for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    ok = sum(n for (_, status), n in outcomes.items() if status == 200)
    wait_for(lambda: len(admin.export(tenant_id)) >= ok, 5, 0.1)
    rows = admin.export(tenant_id)
    spent = sum(int(row["cost_micro"]) for row in rows if row["status"] == "ok")
    # the stated bound: no overshoot at all; and what the regions leave unspent when both are refused
    # is less than, per region, a reservation (36 tokens) and what its 3 requests in flight reserved
    assert spent <= budget, f"overspent: {spent} of {budget} ({outcomes})"
    assert spent >= budget - 2 * 4 * 36_000, f"{spent} of {budget} spent ({outcomes})"
    assert all(outcomes[(r.name, 200)] > 0 for r in regions.regions), outcomes


def _store_health(http: httpx.Client, base: str) -> dict[str, Any]:
    found: dict[str, Any] = http.get(base + "/healthz").json()["store"]
    return found


def test_the_wan_cut_while_both_regions_serve_loses_and_doubles_no_record(regions: Regions) -> None:
    admin, tenant_id, _, secret = _key(regions, "cut")
    served: list[str] = []
    with httpx.Client(timeout=10) as http:
        regions.wan.cut()
        try:
            until = time.monotonic() + CUT_S
            while time.monotonic() < until:
                for region in regions.regions:
                    answer = ask(http, region.url, "cut", secret, stream=len(served) % 4 == 1)
                    assert answer.status_code == 200, (region.name, answer.text)
                    served.append(answer.headers["cf-ray"])
            cut_off = _store_health(http, regions.regions[1].url)
        finally:
            regions.wan.restore()
        assert cut_off["tenancy_replica"] == "down" and cut_off["ledger_unshipped"] > 0, cut_off
        wait_for(lambda: _store_health(http, regions.regions[1].url)["ledger_unshipped"] == 0, 15, 0.2)
    wait_for(lambda: len(admin.export(tenant_id)) >= len(served) + 1, 15, 0.2)  # + _key's request
    time.sleep(0.5)  # anything shipped twice would show by now
    counts = Counter(row["request_id"] for row in admin.export(tenant_id))
    assert all(counts[request_id] == 1 for request_id in served), [r for r in served if counts[r] != 1]
    assert max(counts.values()) == 1 and len(counts) == len(served) + 1


def test_a_cut_region_spends_a_budget_within_its_leases_then_refuses(regions: Regions) -> None:
    budget, lease, cost = 1_000_000, 100_000, 32_000  # budget_lease_fraction 0.1; 32 tokens a request
    admin, tenant_id, _, secret = _key(regions, "cut-budget", monthly_budget_micro=budget)
    second = regions.regions[1]
    served = 0
    with httpx.Client(timeout=10) as http:
        assert ask(http, second.url, "cut-budget", secret).status_code == 200  # its first lease
        time.sleep(1.0)  # and the next, renewed in the background
        regions.wan.cut()
        try:
            for _ in range(20):
                status = ask(http, second.url, "cut-budget", secret).status_code
                if status == 429:
                    break
                assert status == 200
                served += 1
        finally:
            regions.wan.restore()
    # it served what its leases held (at most two, one and a half of them unspent at the cut), then refused
    assert 0 < served and (served + 1) * cost <= 2 * lease, served
    wait_for(lambda: len(admin.export(tenant_id)) == served + 2, 15, 0.2)  # + _key's and the first request
    assert sum(int(row["cost_micro"]) for row in admin.export(tenant_id)) <= budget


def test_a_regions_restarted_store_recovers_tenancy_from_home_and_serves_again(regions: Regions) -> None:
    admin, tenant_id, _, secret = _key(regions, "restart")
    second = regions.regions[1]
    regions.restart_store(second)
    with httpx.Client(timeout=10) as http:
        took = wait_for(lambda: ask(http, second.url, "restart", secret).status_code == 200, 15, 0.1)
        answer = ask(http, second.url, "restart", secret)
    assert answer.status_code == 200
    request_id = answer.headers["cf-ray"]
    wait_for(lambda: request_id in {row["request_id"] for row in admin.export(tenant_id)}, 5, 0.1)
    assert took < 15
