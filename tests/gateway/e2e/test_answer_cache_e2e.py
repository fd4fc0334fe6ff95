"""The opt-in response cache (gateway/pipeline/answer_cache.py) through a real gateway in front of the
stub backend: HIT / MISS, TTL, skip, per tenant, streamed replays, the ledger and the export, the cap."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.processes import ChildProcess
from gateway.store import Store
from gateway.store.local.cache import MemoryCache
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, InProcessGateway, gateway_settings
from tests.gateway.store.local.test_tables import Clock
from tests.gateway.stub_backend import MODEL_ID as STUB

pytestmark = pytest.mark.slow
PRICES = {STUB: {"version": "c1", "input": "0.10", "cached_input": "0.05", "output": "0.20"}}
TTL = {"cf-aig-cache-ttl": "3600"}


def stub_gateway(stub: ChildProcess, tmp: Path, clock: Clock | None = None, **overrides: Any) -> InProcessGateway:
    backends = [{"id": "stub", "base_url": stub.url, "region": "local", "models": [STUB]}]
    models = [{"id": STUB, "backend_model": "stub", "block_size": 16}]
    settings = gateway_settings(tmp, backends, models=models, prices=PRICES, **overrides)

    def with_clock(store: Store) -> Store:  # the cache's TTLs on a clock the test moves
        return dataclasses.replace(store, cache=MemoryCache(settings.store, clock))

    return InProcessGateway(settings, wrap_store=with_clock if clock is not None else None).start()


@pytest.fixture(scope="module")
def clock() -> Clock:
    return Clock()


@pytest.fixture(scope="module")
def gw(stub_backend: ChildProcess, clock: Clock, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    started = stub_gateway(stub_backend, tmp_path_factory.mktemp("cache"), clock)
    yield started
    started.stop()


def url(gw: InProcessGateway, account: str, route: str) -> str:
    path = f"ai/run/{STUB}" if route == "run" else f"ai/v1/{route}"
    return f"{gw.url}/client/v4/accounts/{account}/{path}"


def body_of(route: str, prompt: str, **fields: Any) -> dict[str, Any]:
    if route == "completions":
        return {"model": STUB, "prompt": prompt, **fields}
    base = {"model": STUB} if route == "chat/completions" else {}
    return {**base, "messages": [{"role": "user", "content": prompt}], **fields}


def post(gw: InProcessGateway, account: str, secret: str, route: str, body: dict[str, Any],
         headers: dict[str, str] | None = None) -> httpx.Response:
    answer = httpx.post(url(gw, account, route), json=body, timeout=30,
                        headers={"authorization": f"Bearer {secret}", **(headers or {})})
    assert answer.status_code == 200, answer.text
    return answer


def events(answer: httpx.Response) -> list[Any]:
    lines = [line[len("data: "):] for line in answer.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def status(gw: InProcessGateway, answer: httpx.Response) -> str:
    return gw.ledger_record(answer.headers["cf-ray"]).status


@pytest.mark.parametrize("route", ["run", "chat/completions", "completions"])
def test_an_identical_request_is_a_hit_that_costs_nothing(gw: InProcessGateway, route: str) -> None:
    secret = gw.new_key("t-routes", "acc-routes")
    body = body_of(route, f"hello from {route}")
    first = post(gw, "acc-routes", secret, route, body, TTL)
    assert first.headers["cf-aig-cache-status"] == "MISS"
    missed = gw.ledger_record(first.headers["cf-ray"])
    assert (missed.status, missed.completion_tokens > 0, missed.cost_micro > 0) == ("ok", True, True)
    second = post(gw, "acc-routes", secret, route, {**body, "stream": False}, TTL)  # `stream` is not the request
    assert second.headers["cf-aig-cache-status"] == "HIT"
    hit = gw.ledger_record(second.headers["cf-ray"])
    assert (hit.status, hit.prompt_tokens, hit.cached_tokens, hit.completion_tokens, hit.cost_micro) == (
        "cached", 0, 0, 0, 0)
    assert (hit.backend_id, hit.key_id) == (None, missed.key_id)
    a, b = first.json(), second.json()
    if route == "run":
        assert b == a  # Workers AI's body has no id
    else:
        assert b["choices"] == a["choices"] and b["usage"] == a["usage"] and b["id"] != a["id"]
    changed = post(gw, "acc-routes", secret, route, body_of(route, f"hello from {route}", temperature=0.1), TTL)
    assert changed.headers["cf-aig-cache-status"] == "MISS"  # a field that changes the answer: another entry


def test_a_request_without_cache_headers_neither_reads_nor_says(gw: InProcessGateway) -> None:
    secret = gw.new_key("t-plain", "acc-plain")
    body = body_of("run", "no cache please")
    post(gw, "acc-plain", secret, "run", body, TTL)
    plain = post(gw, "acc-plain", secret, "run", body)
    assert "cf-aig-cache-status" not in plain.headers and status(gw, plain) == "ok"


def test_a_streamed_hit_replays_the_original_events(gw: InProcessGateway) -> None:
    secret = gw.new_key("t-stream", "acc-stream")
    body = body_of("run", "stream me", stream=True)
    first = post(gw, "acc-stream", secret, "run", body, TTL)
    second = post(gw, "acc-stream", secret, "run", body, TTL)
    assert (first.headers["cf-aig-cache-status"], second.headers["cf-aig-cache-status"]) == ("MISS", "HIT")
    assert second.headers["content-type"].startswith("text/event-stream")
    original, replayed = events(first), events(second)
    assert [e["response"] for e in replayed] == [e["response"] for e in original]  # delta by delta
    assert replayed[-1]["usage"] == original[-1]["usage"]
    assert status(gw, second) == "cached"
    whole = post(gw, "acc-stream", secret, "run", {**body, "stream": False}, TTL)  # the same answer, whole
    assert whole.json()["result"]["response"] == "".join(e["response"] for e in original)
    chat = body_of("chat/completions", "stream me", stream=True, stream_options={"include_usage": True})
    first = post(gw, "acc-stream", secret, "chat/completions", chat, TTL)
    second = post(gw, "acc-stream", secret, "chat/completions", chat, TTL)
    assert second.headers["cf-aig-cache-status"] == "HIT"

    def deltas(answer: httpx.Response) -> list[Any]:
        return [(c["choices"][0]["delta"], c["choices"][0]["finish_reason"]) if c["choices"] else c["usage"]
                for c in events(answer)]

    assert deltas(second) == deltas(first) and len(deltas(first)) > 3


def test_skip_cache_answers_afresh_and_refreshes_the_entry(gw: InProcessGateway) -> None:
    secret = gw.new_key("t-skip", "acc-skip")
    body = body_of("run", "skip me")
    post(gw, "acc-skip", secret, "run", body, TTL)
    skipped = post(gw, "acc-skip", secret, "run", body, {"cf-aig-skip-cache": "true"})
    assert skipped.headers["cf-aig-cache-status"] == "MISS" and status(gw, skipped) == "ok"
    old_name = post(gw, "acc-skip", secret, "run", body, {**TTL, "cf-skip-cache": "true"})  # AI Gateway's old name
    assert old_name.headers["cf-aig-cache-status"] == "MISS" and status(gw, old_name) == "ok"
    assert post(gw, "acc-skip", secret, "run", body, TTL).headers["cf-aig-cache-status"] == "HIT"


def test_entries_are_the_tenants_another_key_hits_another_tenant_misses(gw: InProcessGateway) -> None:
    first_key, second_key = gw.new_key("t-own", "acc-own"), gw.new_key("t-own", "acc-own")
    other = gw.new_key("t-other", "acc-other")
    body = body_of("chat/completions", "whose answer is this")
    assert post(gw, "acc-own", first_key, "chat/completions", body, TTL).headers["cf-aig-cache-status"] == "MISS"
    same_tenant = post(gw, "acc-own", second_key, "chat/completions", body, TTL)
    assert same_tenant.headers["cf-aig-cache-status"] == "HIT"
    other_tenant = post(gw, "acc-other", other, "chat/completions", body, TTL)
    assert other_tenant.headers["cf-aig-cache-status"] == "MISS" and status(gw, other_tenant) == "ok"
    named = {"cf-aig-cache-key": "greeting"}  # a named entry: any body of the tenant with that name hits it
    post(gw, "acc-own", first_key, "chat/completions", body, named)
    renamed = post(gw, "acc-own", second_key, "chat/completions", body_of("chat/completions", "other words"), named)
    assert renamed.headers["cf-aig-cache-status"] == "HIT"
    assert renamed.json()["choices"][0]["message"] == same_tenant.json()["choices"][0]["message"]
    stranger = post(gw, "acc-other", other, "chat/completions", body, named)
    assert stranger.headers["cf-aig-cache-status"] == "MISS"


def test_an_entry_lives_its_ttl_of_at_least_60_seconds(gw: InProcessGateway, clock: Clock) -> None:
    secret = gw.new_key("t-ttl", "acc-ttl")
    body = body_of("run", "how long do you live")
    short = {"cf-aig-cache-ttl": "5"}  # below AI Gateway's minimum: 60 s
    assert post(gw, "acc-ttl", secret, "run", body, short).headers["cf-aig-cache-status"] == "MISS"
    clock.now += 59
    assert post(gw, "acc-ttl", secret, "run", body, short).headers["cf-aig-cache-status"] == "HIT"
    clock.now += 2
    assert post(gw, "acc-ttl", secret, "run", body, short).headers["cf-aig-cache-status"] == "MISS"
    for bad in ("soon", "-1", "0", "1.5"):
        answer = httpx.post(url(gw, "acc-ttl", "run"), json=body, headers={
            "authorization": f"Bearer {secret}", "cf-aig-cache-ttl": bad})
        assert answer.status_code == 400 and "cf-aig-cache-ttl" in answer.text, bad


def test_the_export_shows_a_hit_at_no_cost(gw: InProcessGateway) -> None:
    secret = gw.new_key("t-export", "acc-export")
    body = body_of("run", "bill me once")
    started = time.time()
    answers = [post(gw, "acc-export", secret, "run", body, TTL) for _ in range(2)]
    for answer in answers:
        gw.ledger_record(answer.headers["cf-ray"])
    export = httpx.get(f"{gw.admin_url}/admin/v1/billing/export", headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
                       params={"from": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started - 1)),
                               "to": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60)),
                               "tenant": "t-export"})
    assert export.status_code == 200, export.text
    rows = {row["request_id"]: row for row in csv.DictReader(io.StringIO(export.text))}
    miss, hit = (rows[a.headers["cf-ray"]] for a in answers)
    assert miss["status"] == "ok" and int(miss["cost_micro"]) > 0
    assert (hit["status"], hit["prompt_tokens"], hit["completion_tokens"], hit["cost_micro"]) == ("cached", "0", "0",
                                                                                                    "0")
    dashboard = httpx.get(f"{gw.admin_url}/dashboard/api/usage", headers={"authorization": f"Bearer {secret}"},
                          params={"from": int(started - 1), "to": int(time.time() + 60)})
    assert dashboard.status_code == 200, dashboard.text
    summary = dashboard.json()
    assert summary["statuses"]["cached"] == 1 and summary["totals"]["failed"] == 0


def test_an_answer_over_the_cap_per_entry_is_not_kept(stub_backend: ChildProcess, tmp_path: Path) -> None:
    small = stub_gateway(stub_backend, tmp_path, cache_max_entry_bytes=400)  # the stub's 64 deltas are more
    try:
        secret = small.new_key("t-cap", "acc-cap")
        body = body_of("run", "too long to keep")
        statuses = [post(small, "acc-cap", secret, "run", body, TTL).headers["cf-aig-cache-status"] for _ in range(2)]
        assert statuses == ["MISS", "MISS"]
        metrics = httpx.get(f"{small.url}/metrics").text
        assert f'edgerun_gateway_response_cache_total{{model="{STUB}",result="too_large"}} 2.0' in metrics
        assert f'edgerun_gateway_response_cache_total{{model="{STUB}",result="miss"}} 2.0' in metrics
    finally:
        small.stop()


@pytest.mark.process  # may start a Redis server
def test_replicas_on_one_redis_share_the_cache(stub_backend: ChildProcess, tmp_path: Path, redis_url: str,
                                               redis_prefix: str) -> None:
    shared = {"redis_url": redis_url, "key_prefix": redis_prefix}
    first, second = (stub_gateway(stub_backend, tmp_path / name, **shared) for name in ("a", "b"))
    try:
        secret = first.new_key("t-redis", "acc-redis")
        body = body_of("chat/completions", "ünïcode through Redis", stream=True)
        missed = post(first, "acc-redis", secret, "chat/completions", body, TTL)
        hit = post(second, "acc-redis", secret, "chat/completions", body, TTL)  # the other replica
        assert (missed.headers["cf-aig-cache-status"], hit.headers["cf-aig-cache-status"]) == ("MISS", "HIT")
        assert [c["choices"] for c in events(hit)] == [c["choices"] for c in events(missed)]
        assert second.ledger_record(hit.headers["cf-ray"]).status == "cached"
    finally:
        first.stop()
        second.stop()


def test_a_stream_its_client_left_is_not_kept(slow_stub_backend: ChildProcess, tmp_path: Path) -> None:
    slow = stub_gateway(slow_stub_backend, tmp_path)  # 4-second answers
    try:
        secret = slow.new_key("t-left", "acc-left")
        body = body_of("run", "i will leave early", stream=True)
        with httpx.stream("POST", url(slow, "acc-left", "run"), json=body, timeout=30,
                          headers={"authorization": f"Bearer {secret}", **TTL}) as left:
            assert left.headers["cf-aig-cache-status"] == "MISS"
            next(line for line in left.iter_lines() if line.startswith("data: {"))
            request_id = left.headers["cf-ray"]
        assert slow.ledger_record(request_id).status == "cancelled"
        again = post(slow, "acc-left", secret, "run", body, TTL)
        assert again.headers["cf-aig-cache-status"] == "MISS" and status(slow, again) == "ok"
    finally:
        slow.stop()
