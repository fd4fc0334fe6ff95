"""Cache-aware routing over two real vLLM backends, fed by their ZMQ KV events.

The session's vLLM (`vllm-a`) and a second one started for this module (`vllm-b`, in dev mode
for `POST /reset_prefix_cache`) sit behind one gateway whose policy is cache_aware. A tenant's
long prompt is first sent straight to one vLLM, as the gateway would send it (its token ids and
the tenant's `cache_salt`) but not through it: the gateway has routed nothing there, so only
that vLLM's `BlockStored` events can tell it where the prefix is. A second request sharing the
prefix, in a new session (no `x-session-affinity` stickiness to follow), must then go there and
be answered from vLLM's cache. A prefix-cache reset on vLLM (`AllBlocksCleared`) must empty
that backend's entries in the index, and only that backend's. (A restarted vLLM is the other way
its cache empties: a new publisher, whose restarted sequence the gateway's subscriber takes as a
lost stream and clears the same entries: tests/backends/test_zmq_events.py.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.fixtures_e2e import InProcessGateway, gateway_settings
from tests.vllm.fixtures import VLLM_API_KEY, VLLM_MODEL_ID, vllm_model_spec
from tests.vllm.server import SERVED_MODEL, VllmProcess, running_vllm
from tests.vllm.test_gateway_vllm import LONG_CONTEXT, eventually, indexed_tokens

pytestmark = pytest.mark.slow

TENANT, ACCOUNT = "t-vllm-route", "acc-vllm-route"
AUTH = {"authorization": f"Bearer {VLLM_API_KEY}"}


@pytest.fixture(scope="module")
def second_vllm(vllm_checkpoint: Path) -> Iterator[VllmProcess]:
    with running_vllm("vllm-b", vllm_checkpoint, VLLM_API_KEY, dev_mode=True) as server:
        yield server


@pytest.fixture(scope="module")
def servers(vllm_server: VllmProcess, second_vllm: VllmProcess) -> dict[str, VllmProcess]:
    return {"vllm-a": vllm_server, "vllm-b": second_vllm}


@pytest.fixture(scope="module")
def pair_gateway(
    servers: dict[str, VllmProcess], vllm_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[InProcessGateway]:
    settings = gateway_settings(
        tmp_path_factory.mktemp("vllm-pair"),
        [server.spec(backend_id, [VLLM_MODEL_ID]) for backend_id, server in servers.items()],
        models=[vllm_model_spec(vllm_checkpoint)],
        backend_api_key=VLLM_API_KEY,
        health_interval_s=0.5,
        routing_policy="cache_aware",
    )
    gw = InProcessGateway(settings).start()
    try:
        for backend_id, server in servers.items():
            subscribed(gw, backend_id, server)
        yield gw
    finally:
        gw.stop()


def subscribed(gw: InProcessGateway, backend_id: str, server: VllmProcess) -> None:
    """Wait until the gateway receives `server`'s KV events (a ZMQ subscriber misses what is
    published before it is connected): a tiny unsalted request at a time until a batch arrives."""
    registry = gw.services.metrics.registry

    def received() -> bool:
        seed(server, f"{uuid.uuid4().hex} ping", None)
        return bool(registry.get_sample_value("edgerun_gateway_kv_event_batches_total", {"backend": backend_id}))

    assert eventually(received, timeout_s=60), f"no KV events from {backend_id}"


def seed(server: VllmProcess, text: str, salt: str | None, token_ids: list[int] | None = None) -> None:
    """One completion sent straight to vLLM, bypassing the gateway."""
    body: dict[str, object] = {"model": SERVED_MODEL, "prompt": token_ids or text, "max_tokens": 1}
    if salt is not None:
        body["cache_salt"] = salt
    httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=180).raise_for_status()


def seed_as_tenant(gw: InProcessGateway, server: VllmProcess, text: str) -> None:
    """The raw prompt `text` sent straight to `server` as the gateway would send it for TENANT:
    the gateway's token ids and the tenant's cache_salt."""
    services = gw.services
    model = services.catalog.get(VLLM_MODEL_ID)

    async def ids_and_salt() -> tuple[list[int], str]:
        tokenizer = await services.generator.tokenizer(model)
        return list(tokenizer.encode_text(text, is_raw=True)), await services.generator.router.salts.salt(TENANT)

    token_ids, salt = gw.call(ids_and_salt())
    seed(server, text, salt, token_ids)


def test_a_shared_prefix_goes_to_the_vllm_whose_events_say_it_holds_it(
    pair_gateway: InProcessGateway, servers: dict[str, VllmProcess]
) -> None:
    key = pair_gateway.new_key(TENANT, ACCOUNT)
    url = f"{pair_gateway.url}/client/v4/accounts/{ACCOUNT}/ai/run/{VLLM_MODEL_ID}"
    for backend_id, server in servers.items():  # one prefix on each: a blind router would be right 1 time in 4
        (other,) = set(servers) - {backend_id}
        prefix = f"{uuid.uuid4().hex} {LONG_CONTEXT}"
        seed_as_tenant(pair_gateway, server, prefix)
        assert eventually(lambda p=prefix, b=backend_id: indexed_tokens(pair_gateway, TENANT, p, b) > 500)  # type: ignore[misc]
        assert indexed_tokens(pair_gateway, TENANT, prefix, other) == 0
        body = {"prompt": f"{prefix} Which lighthouse is first?", "raw": True, "max_tokens": 2, "temperature": 0}
        headers = {"authorization": f"Bearer {key}", "x-session-affinity": uuid.uuid4().hex}  # a new session
        answer = httpx.post(url, json=body, headers=headers, timeout=180)
        assert answer.status_code == 200, answer.text
        record = pair_gateway.ledger_record(answer.headers["cf-ray"])
        cached = answer.json()["result"]["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert record.backend_id == backend_id
        assert cached > 500 and record.cached_tokens == cached  # and vLLM answered it from that cache


def test_a_prefix_cache_reset_on_vllm_empties_its_entries_and_only_its_own(
    pair_gateway: InProcessGateway, servers: dict[str, VllmProcess]
) -> None:
    texts = {backend_id: f"{uuid.uuid4().hex} {LONG_CONTEXT}" for backend_id in servers}
    for backend_id, text in texts.items():
        seed_as_tenant(pair_gateway, servers[backend_id], text)
    assert eventually(lambda: all(indexed_tokens(pair_gateway, TENANT, t, b) > 500 for b, t in texts.items()))
    reset = httpx.post(f"{servers['vllm-b'].url}/reset_prefix_cache", headers=AUTH, timeout=60)
    assert reset.status_code == 200 and reset.json() == {"success": True}, reset.text
    # vLLM publishes a step's KV events after the step: the reset's AllBlocksCleared goes out with
    # the next request's (this one: unsalted, so none of its own blocks enter the index)
    seed(servers["vllm-b"], f"{uuid.uuid4().hex} ping", None)
    assert eventually(lambda: indexed_tokens(pair_gateway, TENANT, texts["vllm-b"], "vllm-b") == 0)
    assert indexed_tokens(pair_gateway, TENANT, texts["vllm-a"], "vllm-a") > 500
