"""The sentence encoder against a reference: transformers' BertModel on the same checkpoint, with the
checkpoint's mean pooling and normalisation, to 1e-4 cosine; batching and padding change nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from engines.embedding.batcher import EmbeddingBatcher
from engines.embedding.encoder import SentenceEncoder
from engines.embedding.package import minilm_dir

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Edge gateways route requests to regional GPU backends.",
    "a",
    "Café au lait, s'il vous plaît! 東京 " * 40,  # long: truncated to max_seq_length
]


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    return minilm_dir(Path.home() / ".cache" / "edgerun")


@pytest.fixture(scope="module")
def encoder(checkpoint: Path) -> SentenceEncoder:
    return SentenceEncoder.load(checkpoint, max_batch=3)


def reference(checkpoint: Path, texts: list[str]) -> torch.Tensor:
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
    model = transformers.BertModel.from_pretrained(str(checkpoint)).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].float()
    return F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_vectors_match_transformers_bert_with_the_checkpoints_pooling(
    checkpoint: Path, encoder: SentenceEncoder
) -> None:
    ours = encoder.embed(TEXTS)
    assert ours.vectors.shape == (len(TEXTS), 384) and encoder.pooling == "mean" and encoder.normalize
    cosine = F.cosine_similarity(ours.vectors, reference(checkpoint, TEXTS), dim=-1)
    assert cosine.min().item() > 1 - 1e-4, cosine
    assert torch.allclose(ours.vectors.norm(dim=-1), torch.ones(len(TEXTS)), atol=1e-5)
    assert ours.num_tokens[2] == 3 and ours.num_tokens[3] == 256  # [CLS] a [SEP]; truncated


def test_a_vector_does_not_depend_on_its_batch(encoder: SentenceEncoder) -> None:
    texts = [*TEXTS[:3], "Café au lait, s'il vous plaît! 東京 " * 3]  # short: the padding is what matters
    together = encoder.embed(texts).vectors  # batches of 3 and 1, padded to their longest
    alone = torch.cat([encoder.embed([text]).vectors for text in texts])
    assert torch.allclose(together, alone, atol=1e-5)
    paraphrase = encoder.embed(["A fast brown fox leaps over a lazy dog."]).vectors[0]
    assert F.cosine_similarity(together[0], paraphrase, dim=0) > F.cosine_similarity(together[0], together[1], dim=0)


def test_requests_arriving_together_share_a_forward_pass(encoder: SentenceEncoder) -> None:
    requests = [["the sea"], ["a lake", "a river"], ["tax law"], ["x"]]

    async def run() -> tuple[list[torch.Tensor], int]:
        batcher = EmbeddingBatcher(encoder)
        batcher.start()
        try:
            results = await asyncio.gather(*(batcher.embed(texts) for texts in requests))
        finally:
            await batcher.stop()
        return [r.vectors for r in results], batcher.num_batches

    vectors, num_batches = asyncio.run(run())
    assert num_batches < len(requests)
    for texts, got in zip(requests, vectors):
        assert torch.allclose(got, encoder.embed(texts).vectors, atol=1e-5)
