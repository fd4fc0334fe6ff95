"""`edgerun backend --engine embedding` as a real process: OpenAI's embeddings protocol, behind the
backend's bearer secret, vectors equal to the encoder's own, usage counting every input token."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import torch

from cli.processes import ChildProcess
from engines.embedding.encoder import SentenceEncoder
from engines.embedding.package import minilm_dir
from tests.gateway.fixtures_e2e import EMBEDDING_BACKEND_KEY


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
    ],
)
def test_bad_input_gets_400_naming_the_field(backend: ChildProcess, body: object, param: str) -> None:
    answer = post(backend, body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == param


def test_only_the_gateway_may_call(backend: ChildProcess) -> None:
    assert post(backend, {"input": "x"}, key="wrong").status_code == 401
    assert httpx.get(f"{backend.url}/health", timeout=5).status_code == 200
