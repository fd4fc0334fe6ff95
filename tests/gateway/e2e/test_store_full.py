"""A full Redis (maxmemory reached, noeviction) gives clear 503s, never 500s, and usage records go
to the spool. Runs its own redis-server with a tiny maxmemory: the shared one is never filled."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from cli.processes import ChildProcess
from contracts.usage import Usage
from gateway.billing.metering import MeteredRequest, Metering
from gateway.billing.spool import LedgerSpool
from gateway.context import Principal
from gateway.fleet.catalog import DEFAULT_MODEL_ID, ModelSpec
from gateway.http.app import create_app
from gateway.metrics import GatewayMetrics
from gateway.settings import GatewaySettings
from gateway.store import StoreUnavailable, open_store
from policies.pricing import PriceTable
from tests.gateway.fixtures_context import context_now
from tests.gateway.redis_server import EPHEMERAL, start_redis
from tests.gateway.stub_backend import MODEL_ID as STUB_MODEL

pytestmark = pytest.mark.process

PREFIX = "edgerun-full:"


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[str]:
    server = start_redis(tmp_path, [*EPHEMERAL, "--maxmemory", "8mb", "--maxmemory-policy", "noeviction"])
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop(timeout_s=10)


def fill(url: str) -> None:
    """Write 3 MB, then lower maxmemory below that: Redis is well past full (its own server)."""
    with redis.Redis.from_url(url) as client:
        for i in range(12):
            client.set(f"filler:{i}", b"x" * 256_000)
        client.config_set("maxmemory", "1mb")
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            client.set("one-more", "x")


def empty(url: str) -> None:
    with redis.Redis.from_url(url) as client:
        client.delete(*client.keys("filler:*"))
        client.config_set("maxmemory", "8mb")


def settings(url: str, tmp_path: Path, **overrides: Any) -> GatewaySettings:
    return GatewaySettings(
        redis_url=url, key_prefix=PREFIX, sqlite_path=str(tmp_path / "unused.sqlite3"),
        admin_token="admin-secret-0123456789abcdefghijklmnop",
        tokenizer_cache_dir=None, ledger_spool_path=str(tmp_path / "spool.jsonl"), **overrides,
    )


async def test_a_full_redis_answers_503_in_the_envelope(
    small_redis: str, tmp_path: Path, stub_backend: ChildProcess
) -> None:
    store = open_store(settings(small_redis, tmp_path).store)
    await store.tenancy.create_tenant("Acme", ["acc"], tenant_id="acme")
    _, secret = await store.tenancy.create_key("acme")
    await store.aclose()
    fill(small_redis)
    # a backend to tokenize with: the request is refused at its admission, the first write it asks for
    fleet = {"backends": [{"id": "stub", "base_url": stub_backend.url, "models": [STUB_MODEL]}],
             "models": [{"id": STUB_MODEL, "backend_model": "stub", "block_size": 16}]}
    with TestClient(create_app(settings(small_redis, tmp_path, **fleet))) as client:
        admin = client.post("/admin/v1/tenants", json={"name": "B", "account_ids": ["b"]},
                            headers={"authorization": "Bearer admin-secret-0123456789abcdefghijklmnop"})
        run = client.post(f"/client/v4/accounts/acc/ai/run/{STUB_MODEL}", json={"prompt": "hi"},
                          headers={"authorization": f"Bearer {secret}"})
    for answer in (admin, run):
        assert answer.status_code == 503, answer.text
        body = answer.json()
        assert body["success"] is False and body["result"] is None
        assert body["errors"][0]["code"] == 3043 and "full" in body["errors"][0]["message"]
        assert answer.headers["retry-after"]


async def test_usage_records_go_to_the_spool_while_redis_is_full(small_redis: str, tmp_path: Path) -> None:
    store = open_store(settings(small_redis, tmp_path).store)
    try:
        tenant = await store.tenancy.create_tenant("Acme", ["acc"], tenant_id="acme")
        key, _ = await store.tenancy.create_key("acme")
        fill(small_redis)
        spool = LedgerSpool(tmp_path / "spool.jsonl")
        metering = Metering(store, PriceTable.from_config({}), GatewayMetrics(), spool)
        model = ModelSpec(id=DEFAULT_MODEL_ID, backend_model=DEFAULT_MODEL_ID)
        ctx = context_now("req-full", Principal(key, tenant, "acc"), model)
        request = MeteredRequest(ctx, prompt_tokens=5)
        with pytest.raises(StoreUnavailable, match="full"):
            await store.admission.check_and_consume("key_x", 1, None, 0)
        assert await metering.settle(request, Usage(5, 3, 0), status="ok", backend_id="b1", region="local")
        assert spool.pending() and await store.ledger.get("req-full") is None
        empty(small_redis)
        result = await spool.replay(store.ledger)
        assert result.written == 1 and result.complete
        record = await store.ledger.get("req-full")
        assert record is not None and record.completion_tokens == 3
    finally:
        await store.aclose()
