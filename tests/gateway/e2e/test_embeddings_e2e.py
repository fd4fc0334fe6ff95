"""Embeddings end to end: the official openai SDK and Workers AI's /ai/run shape through the gateway
to a real `edgerun backend --engine embedding` process (all-MiniLM-L6-v2), billed per input token;
one tenant's big batches neither starve another tenant nor bill a caller that hung up."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import cloudflare
import httpx
import openai
import pytest

from cli.processes import ChildProcess
from contracts.usage import Usage
from gateway.store.models import UsageRecord
from policies.pricing import Price, cost_micros
from tests.gateway.fixtures_e2e import (
    EMBEDDING_BACKEND_KEY,
    FULL_TEXT,
    InProcessGateway,
    embedding_metric,
    gateway_settings,
    wait_for,
)

MINILM = "@cf/sentence-transformers/all-minilm-l6-v2"
PRICE = {"version": "emb-1", "input": "100", "output": "0"}  # per 1M input tokens: 12 tokens cost 1200 micro-units


@pytest.fixture(scope="module")
def backend(embedding_backend: ChildProcess) -> ChildProcess:
    return embedding_backend


@pytest.fixture(scope="module")
def gateway(backend: ChildProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    settings = gateway_settings(
        tmp_path_factory.mktemp("embeddings"),
        [{"id": "emb-1", "base_url": backend.url, "region": "local", "models": [MINILM]}],
        models=[{"id": MINILM, "backend_model": "all-minilm-l6-v2", "task": "Text Embeddings"}],
        prices={MINILM: PRICE},
        backend_api_key=EMBEDDING_BACKEND_KEY,
    )
    started = InProcessGateway(settings).start()
    yield started
    started.stop()


@pytest.fixture(scope="module")
def key(gateway: InProcessGateway) -> str:
    return gateway.new_key("emb", "acc-emb")


def test_openai_sdk_embeddings_are_unit_vectors_billed_per_input_token(gateway: InProcessGateway, key: str) -> None:
    client = openai.OpenAI(api_key=key, base_url=f"{gateway.url}/client/v4/accounts/acc-emb/ai/v1", max_retries=0)
    raw = client.embeddings.with_raw_response.create(model=MINILM, input=["the sea", "a lake", "tax law"])
    answer = raw.parse()
    vectors = [item.embedding for item in answer.data]
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in vectors)
    sea_lake = sum(a * b for a, b in zip(vectors[0], vectors[1]))
    sea_tax = sum(a * b for a, b in zip(vectors[0], vectors[2]))
    assert sea_lake > sea_tax
    assert answer.usage.prompt_tokens == 12 == answer.usage.total_tokens  # [CLS] w w [SEP] x 3
    record = gateway.ledger_record(raw.headers["cf-ray"])
    assert (record.model, record.prompt_tokens, record.completion_tokens, record.status) == (MINILM, 12, 0, "ok")
    price = Price.from_config(MINILM, PRICE)
    assert record.price_version == "emb-1" and record.cost_micro == cost_micros(Usage(12, 0), price) > 0
    # the SDK asked for base64 (its default) and decoded it; plain floats give the same vector
    floats = client.embeddings.create(model=MINILM, input="the sea", encoding_format="float").data[0].embedding
    assert max(abs(a - b) for a, b in zip(floats, vectors[0])) < 1e-6


def test_workers_ai_run_answers_shape_and_data(gateway: InProcessGateway, key: str) -> None:
    url = f"{gateway.url}/client/v4/accounts/acc-emb/ai/run/{MINILM}"
    one = httpx.post(url, json={"text": "the sea"}, headers={"authorization": f"Bearer {key}"}, timeout=60)
    assert one.status_code == 200, one.text
    result = one.json()["result"]
    assert result["shape"] == [1, 384] and len(result["data"][0]) == 384
    many = httpx.post(url, json={"text": ["a", "b"]}, headers={"authorization": f"Bearer {key}"}, timeout=60)
    assert many.json()["result"]["shape"] == [2, 384]
    refusals = (({"text": []}, "text"), ({"text": "x", "pooling": "cls"}, "pooling"), ({"prompt": "x"}, "prompt"))
    for body, param in refusals:
        refused = httpx.post(url, json=body, headers={"authorization": f"Bearer {key}"}, timeout=60)
        assert refused.status_code == 400 and param in refused.json()["errors"][0]["message"]


def test_the_wrong_route_for_a_model_says_which_is_right(gateway: InProcessGateway, key: str) -> None:
    client = openai.OpenAI(api_key=key, base_url=f"{gateway.url}/client/v4/accounts/acc-emb/ai/v1", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MINILM, messages=[{"role": "user", "content": "hi"}])
    assert "/ai/v1/embeddings" in str(caught.value) and caught.value.body["param"] == "model"  # type: ignore[index]


def test_cloudflare_sdk_embeddings(gateway: InProcessGateway, key: str) -> None:
    client = cloudflare.Cloudflare(api_token=key, base_url=f"{gateway.url}/client/v4", max_retries=0)
    result: Any = client.ai.run(MINILM, account_id="acc-emb", text=["the sea", "a lake"])
    shape = result["shape"] if isinstance(result, dict) else result.shape
    data = result["data"] if isinstance(result, dict) else result.data
    assert shape == [2, 384] and len(data) == 2 and all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in data)


def run_url(account: str) -> str:
    return f"/client/v4/accounts/{account}/ai/run/{MINILM}"


def records(gateway: InProcessGateway, tenant: str) -> list[UsageRecord]:
    store = gateway.store
    assert store is not None

    async def read() -> list[UsageRecord]:
        return [r async for r in store.ledger.iter_usage(0, time.time() + 60, tenant)]

    return gateway.call(read())


def test_a_big_batch_neither_starves_another_tenant_nor_bills_a_caller_that_hung_up(
    gateway: InProcessGateway, backend: ChildProcess
) -> None:
    key_a, key_b = gateway.new_key("emb-big", "acc-big"), gateway.new_key("emb-small", "acc-small")
    queued = "edgerun_backend_embedding_queued_tokens"
    dropped = 'edgerun_backend_embedding_texts_total{outcome="dropped"}'
    dropped_before = embedding_metric(backend, dropped)
    batch = {"text": [FULL_TEXT] * 15}  # 15 passes of 256 tokens, within the backend's 4096 per tenant

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=60) as client:
            big = asyncio.create_task(client.post(run_url("acc-big"), json=batch, headers=auth(key_a)))
            await asyncio.to_thread(wait_for, lambda: embedding_metric(backend, queued) > 0, "never queued")
            full = await client.post(run_url("acc-big"), json=batch, headers=auth(key_a))
            assert full.status_code == 429 and full.json()["errors"][0]["code"] == 3040, full.text
            assert full.headers["retry-after"]
            small = await client.post(run_url("acc-small"), json={"text": "two words"}, headers=auth(key_b))
            assert small.status_code == 200 and not big.done()  # answered while the batch waits, not after it
            big.cancel()  # the caller hangs up
        await asyncio.to_thread(wait_for, lambda: embedding_metric(backend, queued) == 0, "the batch stayed queued")

    asyncio.run(scenario())
    assert embedding_metric(backend, dropped) > dropped_before  # the backend stopped encoding it
    wait_for(lambda: len(records(gateway, "emb-big")) == 2, "the big tenant's two records")
    by_status = {r.status: r for r in records(gateway, "emb-big")}
    assert set(by_status) == {"cancelled", "rejected"}  # hung up; refused by the full queue
    for record in by_status.values():
        assert (record.prompt_tokens, record.cost_micro, record.backend_id) == (0, 0, "emb-1")


def test_a_refused_request_records_no_tokens_rather_than_the_byte_estimate(gateway: InProcessGateway) -> None:
    key = gateway.new_key("emb-refused", "acc-refused")
    too_many = {"text": [FULL_TEXT] * 17}  # 4352 tokens: more than the backend takes from one request
    answer = httpx.post(f"{gateway.url}{run_url('acc-refused')}", json=too_many, headers=auth(key), timeout=60)
    assert answer.status_code == 400 and "embedding_tenant_max_queued_tokens" in answer.text
    record = gateway.ledger_record(answer.headers["cf-ray"])
    assert (record.status, record.prompt_tokens, record.cost_micro) == ("rejected", 0, 0)  # the estimate: 28k


def test_the_gateway_limits_the_input_tokens_of_one_request(gateway: InProcessGateway, key: str) -> None:
    limit = gateway.settings.limits.embedding_max_input_tokens
    texts = ["x" * (limit // 2)] * 2  # (limit // 2 + 2) * 2 > limit
    answer = httpx.post(f"{gateway.url}{run_url('acc-emb')}", json={"text": texts}, headers=auth(key), timeout=60)
    error = answer.json()["errors"][0]
    assert answer.status_code == 413 and error["code"] == 3006, answer.text
    assert f"limit of {limit}" in error["message"] and "embedding_max_input_tokens" in error["message"]
    assert gateway.call(gateway.store.ledger.get(answer.headers["cf-ray"])) is None  # type: ignore[union-attr]


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}
