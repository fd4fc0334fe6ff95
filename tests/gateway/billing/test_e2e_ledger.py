"""End to end: two gateway processes on one Redis, real backends, clients that leave, a backend killed.

The ledger must hold exactly one record per request that reached a backend, with the tokens the
client saw (or, for a client that left or a stream that broke, at least what it received), priced
from the record's own token counts, and the exports must add up to the ledger.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.processes import ROOT
from gateway.billing.export import ROWS, SUMMARY, SUMMED
from gateway.billing.formats import read_rows
from gateway.billing.prices import PriceHistory
from gateway.billing.recompute import recompute, reprice
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.settings import GatewaySettings
from gateway.store import open_store
from gateway.store.models import UsageRecord
from tests.gateway.billing.clients import Seen, run_request
from tests.gateway.fixtures_e2e import (
    ADMIN_TOKEN,
    BackendProcess,
    GatewayProcess,
    start_backend,
    start_gateway_process,
)

pytestmark = pytest.mark.slow
VICTIM_ONLY = "@cf/test/victim-only"  # served by the victim alone (on gateway B)
MISNAMED = "@cf/test/misnamed"  # b1 does not serve its backend model name: b1 answers 404
ACCOUNT, TENANT = "acc-bill", "t-bill"
PRICES = GatewaySettings(redis_url=None).billing.prices
HISTORY = PriceHistory.from_config(PRICES)


@pytest.fixture
def victim() -> Iterator[BackendProcess]:
    backend = start_backend("victim")
    try:
        backend.wait_ready()
        yield backend
    finally:
        backend.stop()


def gateway_env(tmp: Path, redis_url: str, prefix: str, name: str, backends: list[dict]) -> dict[str, str]:
    models = [
        {"id": DEFAULT_MODEL_ID, "backend_model": "smollm2"},
        {"id": VICTIM_ONLY, "backend_model": "smollm2"},
        {"id": MISNAMED, "backend_model": "not-served"},
    ]
    return {
        "EDGERUN_REDIS_URL": redis_url,
        "EDGERUN_KEY_PREFIX": prefix,
        "EDGERUN_REPLICA_ID": name,
        "EDGERUN_SQLITE_PATH": str(tmp / f"{name}.sqlite3"),
        "EDGERUN_TOKENIZER_CACHE_DIR": str(tmp / "tokenizers"),
        "EDGERUN_ADMIN_TOKEN": ADMIN_TOKEN,
        "EDGERUN_MODELS": json.dumps(models),
        "EDGERUN_BACKENDS": json.dumps(backends),
        "EDGERUN_ROUTING_POLICY": "round_robin",
        "EDGERUN_HEALTH_INTERVAL_S": "3600",  # only failed requests reveal the death (deterministic)
        "EDGERUN_BACKEND_FIRST_BYTE_TIMEOUT_S": "120",  # a slow shared CI machine is not a dead backend
        "EDGERUN_LOG_LEVEL": "warning",
    }


async def ledger(redis_url: str, prefix: str) -> list[UsageRecord]:
    store = open_store(GatewaySettings(redis_url=redis_url, key_prefix=prefix).store)
    try:
        return [r async for r in store.ledger.iter_usage(0, time.time() + 60, TENANT)]
    finally:
        await store.aclose()


async def wait_for_records(redis_url: str, prefix: str, ids: set[str], timeout_s: float = 20) -> list[UsageRecord]:
    """Records land when each gateway finishes its side of a request, which may be after the client's."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = await ledger(redis_url, prefix)
        if ids <= {r.request_id for r in records} or time.monotonic() > deadline:
            await asyncio.sleep(0.5)  # and nothing more arrives
            return await ledger(redis_url, prefix)
        await asyncio.sleep(0.2)


async def kill_when_busy(victim: BackendProcess, started: asyncio.Event, doomed: Seen) -> None:
    """SIGKILL the victim mid-stream: once the load has started and the doomed stream (served by
    the victim alone) has its first tokens, preferably while it generates for two requests or more."""
    await started.wait()
    async with httpx.AsyncClient(timeout=2) as http:
        deadline = time.monotonic() + 60
        while doomed.num_chunks == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            load = (await http.get(f"{victim.url}/load")).json()
            if load.get("running", 0) >= 2:
                break
            await asyncio.sleep(0.05)
    victim.kill()


async def test_two_gateways_one_ledger_through_leavers_and_a_killed_backend(
    victim: BackendProcess, backend_pair: list[BackendProcess], redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    b1 = backend_pair[0]
    a_backends = [victim.spec(), b1.spec([DEFAULT_MODEL_ID, MISNAMED])]
    b_backends = [victim.spec([VICTIM_ONLY]), b1.spec([DEFAULT_MODEL_ID, MISNAMED])]
    store = open_store(GatewaySettings(redis_url=redis_url, key_prefix=redis_prefix).store)
    try:
        await store.tenancy.create_tenant("billing", [ACCOUNT], tenant_id=TENANT)
        _, secret = await store.tenancy.create_key(TENANT)
    finally:
        await store.aclose()
    gateways: list[GatewayProcess] = [
        start_gateway_process(gateway_env(tmp_path, redis_url, redis_prefix, name, backends))
        for name, backends in (("gw-a", a_backends), ("gw-b", b_backends))
    ]
    try:
        await asyncio.gather(*(asyncio.to_thread(g.wait_ready) for g in gateways))
        seen = await drive_load(gateways, victim, secret)
        sent = {s.request_id: s for s in seen}
        assert len(sent) == len(seen) and None not in sent, "every answer carries its request id"
        reached = {s.request_id for s in seen if s.status_code in (200, 429, 500)}
        records = await wait_for_records(redis_url, redis_prefix, {s.request_id for s in seen if s.status_code == 200})
        check_ledger(records, sent)
        await check_exports(records, gateways[1], redis_url, redis_prefix, tmp_path)
        assert {r.request_id for r in records} <= reached
    finally:
        for gateway in gateways:
            gateway.stop()


async def drive_load(gateways: list[GatewayProcess], victim: BackendProcess, secret: str) -> list[Seen]:
    plan = ["stream"] * 5 + ["whole"] * 3 + ["openai"] * 3 + ["leave"] * 5
    started = asyncio.Event()
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=64)) as http:
        before = await run_request(http, gateways[1].url, ACCOUNT, VICTIM_ONLY, secret,
                                   Seen("whole", 3, {"phase": "before"}), "Say hi")

        async def one(i: int, kind: str) -> Seen:
            await asyncio.sleep(0.1 * i)
            seen = Seen(kind, 16 if kind == "leave" else 6, {"i": i, "kind": kind})
            gateway = gateways[i % 2]
            prompt = f"Write a short story about the number {i}."
            result = run_request(http, gateway.url, ACCOUNT, DEFAULT_MODEL_ID, secret, seen, prompt,
                                 session=f"s{i % 3}" if i % 4 == 0 else None)
            task = asyncio.ensure_future(result)
            while not task.done() and seen.num_chunks == 0:
                await asyncio.sleep(0.02)
            if seen.num_chunks:
                started.set()
            return await task

        # A long stream that only the victim serves: the kill always breaks it midway.
        doomed = Seen("stream", 256, {"phase": "doomed"})
        doomed_task = asyncio.ensure_future(run_request(
            http, gateways[1].url, ACCOUNT, VICTIM_ONLY, secret, doomed, "Write a very long story about a lighthouse."
        ))
        killer = asyncio.create_task(kill_when_busy(victim, started, doomed))
        during = await asyncio.gather(*(one(i, kind) for i, kind in enumerate(plan)))
        await killer
        await doomed_task
        # After the death: gateway B still routes this model to the victim (no health check says
        # otherwise), so the request reaches a dead backend before any token: a free record.
        after = [await run_request(http, gateways[1].url, ACCOUNT, VICTIM_ONLY, secret,
                                   Seen("whole", 3, {"phase": "after"}), "Say hi") for _ in range(2)]
        misnamed = [await run_request(http, gateways[0].url, ACCOUNT, MISNAMED, secret,
                                      Seen("stream", 3, {"phase": "misnamed"}), "Say hi") for _ in range(2)]
    assert before.status_code == 200
    assert doomed.status_code == 200 and doomed.broken and doomed.num_chunks > 0, doomed
    assert [s.status_code for s in after] == [429, 429], after
    assert [s.status_code for s in misnamed] == [500, 500], misnamed
    # Every request is answered, except a non-streaming one whose backend died under it (500).
    broke = "the backend failed while generating"
    answered = [s.status_code == 200 or (s.kind == "whole" and broke in str(s.error)) for s in during]
    assert all(answered), [(s.kind, s.status_code, s.error) for s in during if s.error]
    assert sum(s.left for s in during) >= 3, "clients left mid-stream"
    return [before, doomed, *during, *after, *misnamed]


def price(record: UsageRecord) -> int:
    charge = reprice(record, HISTORY)
    assert charge is not None
    return charge.cost_micros


def check_ledger(records: list[UsageRecord], sent: dict[str, Seen]) -> None:
    ids = [r.request_id for r in records]
    assert len(ids) == len(set(ids)), "no request is recorded twice"
    by_id = {r.request_id: r for r in records}
    statuses: dict[str, int] = {}
    client_saw = generated_for_leavers = 0
    for request_id, seen in sent.items():
        record = by_id.get(request_id)
        if seen.status_code in (200, 500) or seen.metadata.get("phase") == "after":  # these reached a backend
            assert record is not None, f"a request that reached a backend has no record: {seen}"
        if record is None:
            continue
        statuses[record.status] = statuses.get(record.status, 0) + 1
        assert record.metadata == seen.metadata and record.tenant_id == TENANT and record.account_id == ACCOUNT
        assert record.cost_micro == price(record)
        assert record.price_version == PRICES.get(record.model, {}).get("version", "unpriced")
        if seen.status_code != 200 or seen.broken:  # refused, or failed before or after its first token: free
            assert record.status in ("backend_error", "rejected") and record.cost_micro == 0, (seen, record)
            assert seen.num_chunks <= record.completion_tokens <= seen.max_tokens, (seen, record)
        elif seen.left:  # the client went away: billed for what was generated, at least what it received
            assert record.status in ("cancelled", "ok", "backend_error"), (seen, record)
            assert seen.num_chunks <= record.completion_tokens <= seen.max_tokens, (seen, record)
            generated_for_leavers += record.completion_tokens if record.cost_micro else 0
        else:  # finished: exactly what the client was told
            assert seen.usage is not None and record.status == "ok", (seen, record)
            assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == seen.usage
            client_saw += seen.usage[1]
            assert record.cost_micro > 0 or record.price_version == "unpriced"
    billed = [r for r in records if r.status in ("ok", "cancelled")]
    assert sum(r.completion_tokens for r in billed) == client_saw + generated_for_leavers
    assert sum(r.cost_micro for r in records) == sum(price(r) for r in billed)
    assert statuses.get("cancelled", 0) >= 2 and statuses.get("ok", 0) >= 8, statuses
    assert statuses.get("backend_error", 0) >= 3, ("killed streams and the dead backend", statuses)
    assert statuses.get("rejected", 0) == 2, statuses
    assert any(r.backend_id == "victim" and r.status == "backend_error" and r.completion_tokens > 0 for r in records)
    assert any(r.session_id is not None for r in records) and {r.backend_id for r in records} >= {"victim", "b1"}
    assert not recompute(records, HISTORY).mismatches


async def check_exports(
    records: list[UsageRecord], gateway: GatewayProcess, redis_url: str, prefix: str, tmp: Path
) -> None:
    totals = {c: 0 for c in SUMMED}
    for r in records:
        totals["prompt_tokens"] += r.prompt_tokens
        totals["cached_tokens"] += r.cached_tokens
        totals["completion_tokens"] += r.completion_tokens
        totals["cost_micro"] += r.cost_micro
    span = {"from": "2020-01-01", "to": "2100-01-01"}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("EDGERUN_")},
           "EDGERUN_REDIS_URL": redis_url, "EDGERUN_KEY_PREFIX": prefix}
    out = tmp / "bill.csv"
    command = [sys.executable, "-m", "cli", "billing", "export", "--from", span["from"], "--to", span["to"],
               "--tenant", TENANT, "--format", "csv", "--out", str(out)]
    done = await asyncio.to_thread(subprocess.run, command, cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    cli_rows = read_rows("csv", out.read_bytes(), ROWS)
    cli_summary = read_rows("csv", (tmp / "bill.summary.csv").read_bytes(), SUMMARY)
    async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
        url = f"{gateway.url}/admin/v1/billing/export"
        params = {**span, "tenant": TENANT, "format": "parquet"}
        http_rows = read_rows("parquet", (await http.get(url, params=params)).content, ROWS)
        http_summary = read_rows("parquet", (await http.get(url, params={**params, "part": "summary"})).content,
                                 SUMMARY)
    assert http_rows == cli_rows and http_summary == cli_summary
    assert [r["request_id"] for r in cli_rows] == [r.request_id for r in records]
    assert sum(s["num_requests"] for s in cli_summary) == len(records)
    for column, total in totals.items():
        if column in ("prompt_tokens", "cached_tokens", "completion_tokens", "cost_micro"):
            assert sum(s[column] for s in cli_summary) == sum(r[column] for r in cli_rows) == total, column
    assert sum(s["savings_micro"] for s in cli_summary) == sum(r["savings_micro"] or 0 for r in cli_rows)
