"""Embeddings end to end: the official openai SDK and Workers AI's /ai/run shape through the gateway
to a real `edgerun backend --engine embedding` process (all-MiniLM-L6-v2), billed per input token."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import cloudflare
import httpx
import openai
import pytest

from cli.processes import ChildProcess
from contracts.usage import Usage
from policies.pricing import Price, cost_micros
from tests.gateway.fixtures_e2e import EMBEDDING_BACKEND_KEY, InProcessGateway, gateway_settings

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
