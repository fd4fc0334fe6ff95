"""`edgerun backend --engine embedding` as a real process: OpenAI's embeddings protocol, behind the
backend's bearer secret, vectors equal to the encoder's own, usage counting every input token; its
queue bounded per tenant (`user`) and in all, shared between tenants, rid of callers that left."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import torch

from cli.processes import ChildProcess
from engines.embedding.encoder import SentenceEncoder
from engines.embedding.package import minilm_dir
from tests.gateway.fixtures_e2e import (
    EMBEDDING_BACKEND_KEY,
    EMBEDDING_QUEUE,
    FULL_TEXT,
    FULL_TOKENS,
    embedding_metric,
    wait_for,
)


@pytest.fixture(scope="module")
def backend(embedding_backend: ChildProcess) -> ChildProcess:
    return embedding_backend


def post(backend: ChildProcess, body: object, key: str = EMBEDDING_BACKEND_KEY) -> httpx.Response:
    return httpx.post(f"{backend.url}/v1/embeddings", json=body, headers={"authorization": f"Bearer {key}"}, timeout=60)


def test_embeddings_match_the_encoder_and_count_tokens(backend: ChildProcess) -> None:
    texts = ["The sea is calm tonight.", "Routing by prefix blocks", "x"]
    answer = post(backend, {"model": "all-minilm-l6-v2", "input": texts})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and body["model"] == "all-minilm-l6-v2"
    encoder = SentenceEncoder.load(minilm_dir(Path.home() / ".cache" / "edgerun"))
    expected = encoder.embed(texts)
    served = torch.tensor([d["embedding"] for d in body["data"]])
    assert torch.allclose(served, expected.vectors, atol=1e-5)
    assert body["usage"]["prompt_tokens"] == sum(expected.num_tokens) == body["usage"]["total_tokens"]
    one = post(backend, {"model": "all-minilm-l6-v2", "input": "x"}).json()
    assert len(one["data"]) == 1 and one["usage"]["prompt_tokens"] == 3  # [CLS] x [SEP]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [1, 2]}, "input"),
        ({"input": "x", "encoding_format": "base64"}, "encoding_format"),
        ({"input": "x", "user": 7}, "user"),
    ],
)
def test_bad_input_gets_400_naming_the_field(backend: ChildProcess, body: object, param: str) -> None:
    answer = post(backend, body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param


def test_only_the_gateway_may_call(backend: ChildProcess) -> None:
    assert post(backend, {"input": "x"}, key="wrong").status_code == 401
    assert httpx.get(f"{backend.url}/health", timeout=5).status_code == 200


def test_the_queue_is_bounded_per_tenant_shared_in_turn_and_drops_a_caller_that_left(backend: ChildProcess) -> None:
    queued = "edgerun_backend_embedding_queued_tokens"
    dropped = 'edgerun_backend_embedding_texts_total{outcome="dropped"}'
    per_tenant = EMBEDDING_QUEUE["tenant_max_queued_tokens"] // FULL_TOKENS  # texts of 256 tokens one tenant may queue
    dropped_before = embedding_metric(backend, dropped)

    async def scenario() -> None:
        headers = {"authorization": f"Bearer {EMBEDDING_BACKEND_KEY}"}
        async with httpx.AsyncClient(base_url=backend.url, headers=headers, timeout=60) as client:
            big = {"input": [FULL_TEXT] * (per_tenant - 1), "user": "tenant-a"}  # a pass per text
            batch = asyncio.create_task(client.post("/v1/embeddings", json=big))
            await asyncio.to_thread(wait_for, lambda: embedding_metric(backend, queued) > 0, "the batch was never queued")
            again = await client.post("/v1/embeddings", json=big)
            assert again.status_code == 429 and again.headers["retry-after"], again.text
            assert "this tenant has" in again.json()["error"]["message"]
            too_big = await client.post("/v1/embeddings", json={"input": [FULL_TEXT] * (per_tenant + 1), "user": "t"})
            assert too_big.status_code == 400 and "embedding_tenant_max_queued_tokens" in too_big.text
            other = await client.post("/v1/embeddings", json={"input": "two words", "user": "tenant-b"})
            assert other.status_code == 200 and not batch.done()  # answered while tenant-a's batch waits
            batch.cancel()  # hang up: the texts not yet encoded go
        await asyncio.to_thread(wait_for, lambda: embedding_metric(backend, queued) == 0, "the batch stayed queued")

    asyncio.run(scenario())
    assert embedding_metric(backend, dropped) > dropped_before
