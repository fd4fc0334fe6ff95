"""End to end: Redis stops mid-run and comes back; the spool keeps every record and replays it once.

Uses a private redis-server (AOF, fsync always) on a free port, never the shared one.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from cli.processes import ChildProcess, free_port
from gateway.billing.spool import LedgerSpool
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.settings import GatewaySettings
from gateway.store import open_store
from gateway.store.models import UsageRecord
from tests.gateway.billing.clients import Seen, run_request
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, BackendProcess, start_gateway_process
from tests.gateway.redis_server import start_redis

pytestmark = pytest.mark.slow
ACCOUNT, TENANT = "acc-spool", "t-spool"


@dataclass
class PrivateRedis:
    """A redis-server that can be stopped and started again on the same port and data directory."""

    port: int
    workdir: Path
    server: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        options = ["--save", "", "--appendonly", "yes", "--appendfsync", "always"]
        self.server = start_redis(self.workdir, options, port=self.port)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(timeout_s=10)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(free_port(), tmp_path / "redis")
    server.workdir.mkdir()
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def ledger(url: str) -> list[UsageRecord]:
    store = open_store(GatewaySettings(redis_url=url).store)
    try:
        return [r async for r in store.ledger.iter_usage(0, time.time() + 60, TENANT)]
    finally:
        await store.aclose()


async def test_records_written_while_redis_is_down_arrive_once_it_is_back(
    private_redis: PrivateRedis, backend_pair: list[BackendProcess], tmp_path: Path
) -> None:
    store = open_store(GatewaySettings(redis_url=private_redis.url).store)
    try:
        await store.tenancy.create_tenant("spool", [ACCOUNT], tenant_id=TENANT)
        _, secret = await store.tenancy.create_key(TENANT)
    finally:
        await store.aclose()
    spool_path = tmp_path / "ledger-spool.jsonl"
    gateway = start_gateway_process({
        "EDGERUN_REDIS_URL": private_redis.url,
        "EDGERUN_REDIS_TIMEOUT_S": "0.5",
        "EDGERUN_SQLITE_PATH": str(tmp_path / "gw.sqlite3"),
        "EDGERUN_TOKENIZER_CACHE_DIR": str(tmp_path / "tokenizers"),
        "EDGERUN_ADMIN_TOKEN": ADMIN_TOKEN,
        "EDGERUN_BACKENDS": json.dumps([backend_pair[0].spec()]),
        "EDGERUN_LEDGER_SPOOL_PATH": str(spool_path),
        "EDGERUN_LEDGER_SPOOL_REPLAY_INTERVAL_S": "0.3",
        "EDGERUN_METRICS_PUBLIC": "true",
        "EDGERUN_HEALTH_INTERVAL_S": "3600",
        "EDGERUN_LOG_LEVEL": "warning",
        "EDGERUN_LOG_JSON": "false",
    })
    try:
        await asyncio.to_thread(gateway.wait_ready)
        async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=32)) as http:

            def request(seen: Seen) -> asyncio.Future[Seen]:
                prompt = f"Tell me about the number {seen.metadata['i']}."
                return asyncio.ensure_future(
                    run_request(http, gateway.url, ACCOUNT, DEFAULT_MODEL_ID, secret, seen, prompt)
                )

            seen = [Seen("stream" if i % 4 else "whole", 12, {"i": i}) for i in range(8)]
            running = [request(s) for s in seen]
            deadline = time.monotonic() + 60
            while sum(s.num_chunks > 0 for s in seen) < 3:  # generation is under way
                assert time.monotonic() < deadline, [t.result() for t in running if t.done()]
                await asyncio.sleep(0.05)
            await asyncio.to_thread(private_redis.stop)
            refused = [await request(Seen("whole", 4, {"i": 100 + i})) for i in range(2)]  # no store, no backend
            await asyncio.gather(*running)
            spooled = spooled_ids(spool_path)
            assert spooled, "some requests ended while Redis was down"
            await asyncio.to_thread(private_redis.start)

            answered = {s.request_id for s in seen if s.status_code == 200}
            assert [s.status_code for s in refused] == [503, 503] and len(answered) == 8
            deadline = time.monotonic() + 20
            while {r.request_id for r in await ledger(private_redis.url)} != answered:
                assert time.monotonic() < deadline, "spooled records were not replayed"
                await asyncio.sleep(0.2)
            metrics = (await http.get(f"{gateway.url}/metrics")).text
    except BaseException:
        print(gateway.log()[-6000:], file=sys.stderr)  # the gateway's side of the story
        raise
    finally:
        gateway.stop()
    records = await ledger(private_redis.url)
    assert sorted(r.request_id for r in records) == sorted(answered)  # none lost, none doubled
    with redis.Redis.from_url(private_redis.url) as client:
        assert client.xlen("edgerun:ledger") == len(answered)  # not even a hidden second stream entry
    assert spooled <= answered and not LedgerSpool(spool_path).pending()
    assert f'edgerun_gateway_usage_records_total{{outcome="spooled"}} {float(len(spooled))}' in metrics
    by_id = {r.request_id: r for r in records}
    for s in seen:
        record = by_id[s.request_id]
        assert record.metadata == s.metadata and record.status == "ok" and s.usage is not None
        assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == s.usage
        assert record.cost_micro > 0


def spooled_ids(path: Path) -> set[str]:
    # The gateway's replay task renames and deletes spool files while we read: one that vanishes
    # between the glob and the read has been replayed into the ledger, which the caller checks.
    ids: set[str] = set()
    for p in path.parent.glob(path.name + "*"):
        if p.name.endswith(".lock"):
            continue
        try:
            text = p.read_text()
        except FileNotFoundError:
            continue
        ids |= {json.loads(line)["request_id"] for line in text.splitlines() if line}
    return ids
