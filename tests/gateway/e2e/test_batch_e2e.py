"""The asynchronous batch API through real processes (`edgerun serve` in front of the stub backend),
with each store: the local store's SQLite file and Redis.

100 items queued, the gateway SIGKILLed while they run and started again on the same store: every
item is answered once, in order, with its external_reference, and billed once (one ledger record
per item, under the item's request id). Limits: a tenant's queued items, the 10 MB payload, the
ordinary body bound without ?queueRequest=true, a bad item; another tenant's request_id is a 404.
Embedding items answer vectors. A batch item whose prompt the backend has cached is billed with the
cached-token discount exactly as the same synchronous request, and the item's run is counted on
/metrics. Fair: another tenant's later one-item batch is answered while a 40-item batch still runs.
SIGTERM drains the running items (none cut, none billed twice) and the queued ones wait for the next
gateway. Interactive first: an item whose tenant has no free concurrency slot waits (given back, not
queued behind the interactive request) and runs once the slot is free."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.processes import ChildProcess
from gateway.settings import GatewaySettings
from gateway.store import UsageRecord, open_store
from tests.gateway import stub_backend
from tests.gateway.fixtures_e2e import held_stream, running_child
from tests.gateway.redis_server import delete_prefix, new_prefix

pytestmark = pytest.mark.slow
RUN = f"/client/v4/accounts/{{account}}/ai/run/{stub_backend.MODEL_ID}"
NUM_ITEMS = 100
LEASE_S = 1.5  # a killed gateway's items are claimed again this long after its last renewal


@pytest.fixture(scope="module")
def stub() -> Iterator[ChildProcess]:
    """Answers of 8 chunks 25 ms apart: 0.2 s an item, so a 100-item batch is mid-way when the gateway is killed;
    repeated prompt prefixes reported cached."""
    command = partial(stub_backend.command, num_chunks=8, chunk_delay_ms=25, prefix_cache=True)
    with running_child("batch stub", command) as child:
        yield child


@pytest.fixture(params=["sqlite", "redis"])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {"EDGERUN_SQLITE_PATH": str(tmp_path / "gateway.sqlite3")}
        return
    url, prefix = request.getfixturevalue("redis_url"), new_prefix()
    yield {"EDGERUN_REDIS_URL": url, "EDGERUN_KEY_PREFIX": prefix}
    delete_prefix(url, prefix)


def serve(stub: ChildProcess, workdir: Path, store_env: dict[str, str], **batch: object) -> ChildProcess:
    env = {**store_env, "EDGERUN_BATCH_LEASE_S": str(LEASE_S), "EDGERUN_BATCH_POLL_INTERVAL_S": "0.05",
           **{f"EDGERUN_{k.upper()}": str(v) for k, v in batch.items()}}
    return stub_backend.start_gateway(stub.port, workdir, env)


def post(gateway: ChildProcess, account: str, key: str, body: dict[str, Any], query: str = "") -> httpx.Response:
    return httpx.post(gateway.url + RUN.format(account=account) + query, json=body,
                      headers={"authorization": f"Bearer {key}"}, timeout=30)


def poll_until_done(gateway: ChildProcess, account: str, key: str, batch_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        answer = post(gateway, account, key, {"request_id": batch_id}, "?queueRequest=true")
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()["result"]
        if "responses" in result:
            return result
        assert result["status"] in ("queued", "running") and result["request_id"] == batch_id
        assert time.monotonic() < deadline, f"the batch is still {result['status']}"
        time.sleep(0.2)


def ledger(store_env: dict[str, str], workdir: Path, tenant_id: str) -> list[UsageRecord]:
    """The tenant's ledger records, read from the store the (stopped) gateway used."""
    settings = GatewaySettings(
        redis_url=store_env.get("EDGERUN_REDIS_URL"), key_prefix=store_env.get("EDGERUN_KEY_PREFIX", "edgerun:"),
        sqlite_path=store_env.get("EDGERUN_SQLITE_PATH", str(workdir / "unused.sqlite3")),
    )

    async def read() -> list[UsageRecord]:
        store = open_store(settings.store)
        try:
            return [r async for r in store.ledger.iter_usage(0, time.time() + 3600, tenant_id)]
        finally:
            await store.aclose()

    import asyncio

    return asyncio.run(read())


def tenant_of(gateway: ChildProcess, account: str) -> str:
    tenants = httpx.get(gateway.url + "/admin/v1/tenants",
                        headers={"authorization": f"Bearer {stub_backend.ADMIN_TOKEN}"}).json()["result"]
    return str(next(t["id"] for t in tenants if account in t["account_ids"]))


def finish_on_a_new_gateway(
    stub: ChildProcess, workdir: Path, env: dict[str, str], account: str, key: str, batch_id: str, **batch: object
) -> tuple[dict[str, Any], str]:
    """A gateway started on the same store finishes the batch: its result, and the account's tenant id."""
    gateway = serve(stub, workdir, env, **batch)
    try:
        return poll_until_done(gateway, account, key, batch_id, timeout_s=60), tenant_of(gateway, account)
    finally:
        gateway.stop()


def test_a_batch_survives_a_killed_gateway_answered_and_billed_once_per_item(
    stub: ChildProcess, store_env: dict[str, str], tmp_path: Path
) -> None:
    gateway = serve(stub, tmp_path, store_env, batch_concurrency=8)
    try:
        key = stub_backend.create_key(gateway.url, "acct-batch")
        requests = [{"prompt": f"item number {i}", "max_tokens": 8, "external_reference": f"ref-{i}"}
                    for i in range(NUM_ITEMS)]
        requests[7].pop("external_reference")  # an item without one answers null
        queued = post(gateway, "acct-batch", key, {"requests": requests}, "?queueRequest=true")
        assert queued.status_code == 200, queued.text
        body = queued.json()
        assert body["success"] is True and body["errors"] == []
        assert body["result"]["status"] == "queued" and body["result"]["model"] == stub_backend.MODEL_ID
        batch_id = body["result"]["request_id"]
        deadline = time.monotonic() + 20
        while post(gateway, "acct-batch", key, {"request_id": batch_id}).json()["result"].get("status") != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.8)  # some items answered, some running, most queued
        assert post(gateway, "acct-batch", key, {"request_id": batch_id}).json()["result"]["status"] == "running"
        gateway.kill()
        killed_at = time.time()
    finally:
        gateway.kill()
    result, tenant_id = finish_on_a_new_gateway(stub, tmp_path, store_env, "acct-batch", key, batch_id, batch_concurrency=8)
    responses = result["responses"]
    assert [r["id"] for r in responses] == list(range(NUM_ITEMS))
    assert all(r["success"] for r in responses), [r for r in responses if not r["success"]][:3]
    assert [r["external_reference"] for r in responses] == [None if i == 7 else f"ref-{i}" for i in range(NUM_ITEMS)]
    assert all(r["result"]["response"] == " tok" * 8 for r in responses)
    assert result["usage"]["completion_tokens"] == 8 * NUM_ITEMS
    assert result["usage"]["total_tokens"] == sum(r["result"]["usage"]["total_tokens"] for r in responses)

    records = [r for r in ledger(store_env, tmp_path, tenant_id) if r.request_id.startswith(batch_id)]
    billed = collections.Counter(int(r.request_id.split(".")[1]) for r in records if r.status == "ok")
    assert billed == {i: 1 for i in range(NUM_ITEMS)}  # one answered record per item, across the kill
    assert all(r.completion_tokens == 8 and r.metadata.get("batch_id") == batch_id for r in records if r.status == "ok")
    before = sum(r.ended_at < killed_at for r in records if r.status == "ok")
    assert 0 < before < NUM_ITEMS  # the kill came mid-batch: the first gateway answered some, the second the rest


def test_limits_and_tenants(stub: ChildProcess, tmp_path: Path) -> None:
    env = {"EDGERUN_SQLITE_PATH": str(tmp_path / "gateway.sqlite3")}
    # no worker: what is queued stays queued; 5 items a tenant; 1 MiB ordinary bodies (the default)
    gateway = serve(stub, tmp_path, env, batch_concurrency=0, batch_max_queued_items=5)
    try:
        key = stub_backend.create_key(gateway.url, "acct-a")
        other = stub_backend.create_key(gateway.url, "acct-b")
        items = [{"prompt": "hello"}] * 3
        first = post(gateway, "acct-a", key, {"requests": items, "queueRequest": True})  # the flag in the body
        assert first.status_code == 200, first.text
        batch_id = first.json()["result"]["request_id"]
        assert post(gateway, "acct-a", key, {"request_id": batch_id}).json()["result"]["status"] == "queued"

        full = post(gateway, "acct-a", key, {"requests": items}, "?queueRequest=true")  # 6 > 5 items
        assert full.status_code == 429 and full.json()["errors"][0]["code"] == 3040
        assert "3 items (" in full.json()["errors"][0]["message"] and "at most 5 items" in full.json()["errors"][0]["message"]
        assert post(gateway, "acct-b", other, {"requests": items}, "?queueRequest=true").status_code == 200

        too_many = post(gateway, "acct-a", key, {"requests": [{"prompt": "x"}] * 6}, "?queueRequest=true")
        assert too_many.status_code == 400 and "at most 5 requests" in too_many.json()["errors"][0]["message"]
        bad = post(gateway, "acct-a", key, {"requests": [{"prompt": "ok"}, {"prompt": 3}]}, "?queueRequest=true")
        assert bad.status_code == 400 and bad.json()["errors"][0]["message"].startswith("requests[1]: ")

        big = {"requests": [{"prompt": "x" * 1_000_000}] * 11}  # 11 MB
        assert post(gateway, "acct-a", key, big, "?queueRequest=true").status_code == 413
        two_mb = {"requests": [{"prompt": "x" * 1_000_000}] * 2}
        assert post(gateway, "acct-a", key, {**two_mb, "queueRequest": True}).status_code == 413  # 1 MiB: no flag in URL

        stranger = post(gateway, "acct-b", other, {"request_id": batch_id})
        assert stranger.status_code == 404 and stranger.json()["errors"][0]["code"] == 7003
        assert post(gateway, "acct-a", key, {"request_id": "no such batch!"}).status_code == 404
    finally:
        gateway.stop()


def test_an_item_runs_only_when_its_tenant_has_a_free_slot(slow_stub_backend: ChildProcess, tmp_path: Path) -> None:
    env = {"EDGERUN_SQLITE_PATH": str(tmp_path / "gateway.sqlite3")}
    gateway = serve(slow_stub_backend, tmp_path, env, batch_concurrency=2)
    try:
        key = stub_backend.create_key(gateway.url, "acct-f", max_concurrent_requests=1)
        with held_stream(gateway.url + RUN.format(account="acct-f"), key, {"prompt": "interactive"}):
            queued = post(gateway, "acct-f", key, {"requests": [{"prompt": "batch"}]}, "?queueRequest=true")
            batch_id = queued.json()["result"]["request_id"]
            time.sleep(1.5)  # the worker has tried it, and found the tenant's one slot taken
            assert "responses" not in post(gateway, "acct-f", key, {"request_id": batch_id}).json()["result"]
        result = poll_until_done(gateway, "acct-f", key, batch_id, timeout_s=30)  # the slot is free: it runs
        tenant_id = tenant_of(gateway, "acct-f")
    finally:
        gateway.stop()
    assert result["responses"][0]["success"] is True
    records = [r for r in ledger(env, tmp_path, tenant_id) if r.request_id.startswith(batch_id)]
    assert [r.status for r in records] == ["ok"]  # refused tries leave no record: nothing reached a backend
    assert ".r" in records[0].request_id  # it ran after being given back at least once


def test_sigterm_lets_running_items_finish_and_leaves_the_rest_queued(stub: ChildProcess, tmp_path: Path) -> None:
    env = {"EDGERUN_SQLITE_PATH": str(tmp_path / "gateway.sqlite3")}
    gateway = serve(stub, tmp_path, env, batch_concurrency=4)
    try:
        key = stub_backend.create_key(gateway.url, "acct-t")
        queued = post(gateway, "acct-t", key, {"requests": [{"prompt": f"item {i}"} for i in range(30)]},
                      "?queueRequest=true")
        batch_id = queued.json()["result"]["request_id"]
        deadline = time.monotonic() + 20
        while post(gateway, "acct-t", key, {"request_id": batch_id}).json()["result"].get("status") != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        gateway.stop()  # SIGTERM: the drain waits for the items in flight
    assert gateway.process.returncode == 0
    result, tenant_id = finish_on_a_new_gateway(stub, tmp_path, env, "acct-t", key, batch_id, batch_concurrency=4)
    assert [r["id"] for r in result["responses"]] == list(range(30))
    records = [r for r in ledger(env, tmp_path, tenant_id) if r.request_id.startswith(batch_id)]
    assert sorted(r.request_id for r in records) == sorted(f"{batch_id}.{i}" for i in range(30))  # none cut, none twice
    assert {r.status for r in records} == {"ok"}


def test_embedding_items_answer_vectors(stub: ChildProcess, tmp_path: Path) -> None:
    embed = "@cf/edgerun/embed-stub"
    models = [{"id": stub_backend.MODEL_ID, "backend_model": "stub", "block_size": 16},
              {"id": embed, "backend_model": "stub-embed", "task": "Text Embeddings"}]
    backends = [{"id": "stub", "base_url": stub.url, "region": "local", "models": [stub_backend.MODEL_ID, embed]}]
    env = {"EDGERUN_SQLITE_PATH": str(tmp_path / "gateway.sqlite3"), "EDGERUN_MODELS": json.dumps(models),
           "EDGERUN_BACKENDS": json.dumps(backends)}
    gateway = serve(stub, tmp_path, env)
    try:
        key = stub_backend.create_key(gateway.url, "acct-e")
        url = f"{gateway.url}/client/v4/accounts/acct-e/ai/run/{embed}?queueRequest=true"
        auth = {"authorization": f"Bearer {key}"}
        body = {"requests": [{"text": ["the sea", "a lake"], "external_reference": "water"}, {"text": "sky"}]}
        batch_id = httpx.post(url, json=body, headers=auth).json()["result"]["request_id"]
        deadline = time.monotonic() + 30
        while "responses" not in (result := httpx.post(url, json={"request_id": batch_id}, headers=auth).json()["result"]):
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        gateway.stop()
    first, second = result["responses"]
    assert first["external_reference"] == "water" and second["external_reference"] is None
    assert first["result"]["shape"] == [2, 2] and first["result"]["data"] == [[7.0, 1.0], [6.0, 1.0]]
    assert second["result"]["data"] == [[3.0, 1.0]]
    assert result["usage"]["prompt_tokens"] == first["result"]["usage"]["prompt_tokens"] + 1


def test_a_batch_item_is_billed_with_the_cached_token_discount_as_its_synchronous_request(
    stub: ChildProcess, tmp_path: Path
) -> None:
    price = {"version": "t1", "input": "60000", "cached_input": "10000", "output": "100000"}  # micro-units a token
    env = {"EDGERUN_SQLITE_PATH": str(tmp_path / "gateway.sqlite3"),
           "EDGERUN_PRICES": json.dumps({stub_backend.MODEL_ID: price})}
    gateway = serve(stub, tmp_path, env, metrics_public="true")
    try:
        key = stub_backend.create_key(gateway.url, "acct-c")
        request = {"prompt": stub_backend.PROMPT + " " + stub_backend.PROMPT, "max_tokens": 8}
        cold, warm = post(gateway, "acct-c", key, request), post(gateway, "acct-c", key, request)
        queued = post(gateway, "acct-c", key, {"requests": [request]}, "?queueRequest=true")
        batch_id = queued.json()["result"]["request_id"]
        item = poll_until_done(gateway, "acct-c", key, batch_id, timeout_s=30)["responses"][0]
        tenant_id = tenant_of(gateway, "acct-c")
        runs = httpx.get(gateway.url + "/metrics").text
    finally:
        gateway.stop()
    assert 'edgerun_gateway_batch_item_runs_total{outcome="ok"} 1.0' in runs
    synchronous = warm.json()["result"]["usage"]
    assert synchronous["prompt_tokens_details"]["cached_tokens"] >= 32  # two blocks of the prompt, at least
    assert item["result"]["usage"] == synchronous  # the item's answer says what the request's said
    records = {r.request_id: r for r in ledger(env, tmp_path, tenant_id)}
    first, second, batched = records[cold.headers["cf-ray"]], records[warm.headers["cf-ray"]], records[f"{batch_id}.0"]
    assert first.cached_tokens == 0 and second.cached_tokens == batched.cached_tokens > 0
    fields = ("prompt_tokens", "cached_tokens", "completion_tokens", "cost_micro", "price_version")
    assert [getattr(batched, f) for f in fields] == [getattr(second, f) for f in fields]  # billed as the request
    discount = (60_000 - 10_000) * batched.cached_tokens
    assert batched.cost_micro == first.cost_micro - discount > 0


def test_a_later_small_batch_is_not_held_back_by_another_tenants_big_one(stub: ChildProcess, tmp_path: Path) -> None:
    env = {"EDGERUN_SQLITE_PATH": str(tmp_path / "gateway.sqlite3")}
    gateway = serve(stub, tmp_path, env, batch_concurrency=1)  # one item at a time, 0.2 s each
    try:
        big_key, small_key = stub_backend.create_key(gateway.url, "acct-big"), stub_backend.create_key(gateway.url, "acct-small")
        big = post(gateway, "acct-big", big_key, {"requests": [{"prompt": f"big {i}"} for i in range(40)]},
                   "?queueRequest=true").json()["result"]["request_id"]
        small = post(gateway, "acct-small", small_key, {"requests": [{"prompt": "small"}]},
                     "?queueRequest=true").json()["result"]["request_id"]
        assert poll_until_done(gateway, "acct-small", small_key, small, timeout_s=5)["responses"][0]["success"]
        assert post(gateway, "acct-big", big_key, {"request_id": big}).json()["result"]["status"] == "running"  # 8 s of work
    finally:
        gateway.stop()
