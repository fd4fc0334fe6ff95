"""A vLLM-kind backend behind the real gateway: a stub that answers like vLLM without
--enable-prompt-tokens-details (tests/gateway/vllm_stub.py), and a ZMQ publisher in the test
standing for vLLM's KV event socket.

- The missing cached_tokens is reported at start-up (probe) and in /healthz, counted in /metrics
  and shown on the dashboard; the request is billed uncached.
- The gateway sends the tenant's salt as cache_salt and asks for token ids.
- KV events published for tenant A's tokens make the index match tenant A's prompt on that
  backend, never tenant B's; AllBlocksCleared empties it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from cli.processes import ChildProcess
from policies.prefix import block_hashes
from tests.gateway import vllm_stub
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, InProcessGateway, gateway_settings, running_child
from tests.gateway.store.calls import match_prefix
from tests.gateway.stub_backend import MODEL_ID

pytestmark = pytest.mark.slow

BLOCK = 4
BILLING_PROBLEM = "cached tokens unknown for vllm-a: start vLLM with --enable-prompt-tokens-details"


@pytest.fixture(scope="module")
def stub() -> Iterator[ChildProcess]:
    with running_child("vllm stub", vllm_stub.command) as child:
        yield child


@pytest.fixture(scope="module")
def publisher() -> Iterator[tuple[zmq.Socket, str]]:
    """vLLM's PUB socket (an XPUB, so the test can wait for the gateway's subscription)."""
    context = zmq.Context()
    pub = context.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    try:
        yield pub, f"tcp://127.0.0.1:{port}"
    finally:
        pub.close(linger=0)
        context.term()


@pytest.fixture(scope="module")
def gw(
    stub: ChildProcess, publisher: tuple[zmq.Socket, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessGateway]:
    pub, endpoint = publisher
    backend = {"id": "vllm-a", "base_url": stub.url, "kind": "vllm", "models": [MODEL_ID], "kv_events": endpoint}
    models = [{"id": MODEL_ID, "backend_model": "stub", "block_size": BLOCK}]
    settings = gateway_settings(tmp_path_factory.mktemp("vllm-kind"), [backend], models=models, health_interval_s=0.2)
    started = InProcessGateway(settings).start()
    pub.setsockopt(zmq.RCVTIMEO, 10_000)
    assert pub.recv()[0] == 1  # the gateway subscribed
    yield started
    started.stop()


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def test_missing_cached_tokens_are_reported_counted_and_billed_uncached(gw: InProcessGateway, stub: ChildProcess) -> None:
    health = wait_for(lambda: httpx.get(f"{gw.url}/healthz").json().get("billing"), "the start-up probe")
    assert health == [BILLING_PROBLEM + " (until then its prompt tokens are billed uncached)"]
    key = gw.new_key("tenant-a", "acct-a")
    response = httpx.post(
        f"{gw.url}/client/v4/accounts/acct-a/ai/run/{MODEL_ID}",
        json={"prompt": "the gateway routes request 1 to backend 1", "max_tokens": 4},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    record = gw.ledger_record(response.headers["cf-ray"])
    assert record.cached_tokens == 0 and record.prompt_tokens > 0 and record.backend_id == "vllm-a"
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert 'edgerun_gateway_cached_tokens_unknown_total{backend="vllm-a"}' in metrics
    dashboard = httpx.get(f"{gw.url}/dashboard/api/usage", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    (row,) = [b for b in dashboard["backends"] if b["backend_id"] == "vllm-a"]
    assert row["reports_cached_tokens"] is False and row["billing_problem"].startswith(BILLING_PROBLEM)
    sent = httpx.get(f"{stub.url}/_test/bodies").json()[-1]  # the last one: the request above
    salt = gw.call(gw.services.generator.router.salts.salt("tenant-a"))
    assert sent["cache_salt"] == salt and sent["return_token_ids"] is True and sent["prompt"]


def test_zmq_events_fill_the_index_for_their_tenant_only(gw: InProcessGateway, publisher: tuple[zmq.Socket, str]) -> None:
    pub, _ = publisher
    salts = gw.services.generator.router.salts
    salt_a, salt_b = gw.call(salts.salt("tenant-a")), gw.call(salts.salt("tenant-b"))
    tokens = list(range(1000, 1016))  # four of the gateway's blocks, two of the engine's

    def publish(seq: int, events: list[Any]) -> None:
        pub.send_multipart([b"", seq.to_bytes(8, "big"), msgpack.packb([time.time(), events, 0])])

    stored = {
        "type": "BlockStored", "block_hashes": [b"\x01" * 32, b"\x02" * 32], "parent_block_hash": None,
        "token_ids": tokens, "block_size": 8, "lora_id": None, "medium": "GPU", "lora_name": None,
        "extra_keys": [[salt_a], None], "group_idx": 0,
    }
    publish(0, [stored])

    def matched(salt: str) -> dict[str, int]:
        return gw.call(match_prefix(gw.store, block_hashes(tokens, BLOCK, salt)))  # type: ignore[union-attr]

    assert wait_for(lambda: matched(salt_a), "the stored blocks in the index") == {"vllm-a": 4}
    assert matched(salt_b) == {}
    publish(1, [{"type": "AllBlocksCleared"}])
    wait_for(lambda: not matched(salt_a), "the index to be cleared")
    assert 'edgerun_gateway_kv_event_batches_total{backend="vllm-a"} 2.0' in httpx.get(f"{gw.url}/metrics").text
