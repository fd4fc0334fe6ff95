"""The sentence encoder against a reference: transformers' BertModel on the same checkpoint, with the
checkpoint's mean pooling and normalisation, to 1e-4 cosine; batching and padding change nothing.
The batcher shares passes between tenants and drops the texts of a caller that left."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
import torch
import torch.nn.functional as F

from engines.embedding.batcher import EmbeddingBatcher
from engines.embedding.encoder import SentenceEncoder
from engines.embedding.fair_queue import QueueLimits
from engines.embedding.package import minilm_dir

pytestmark = pytest.mark.slow  # the real all-MiniLM-L6-v2 encoder, and transformers' BERT beside it

T = TypeVar("T")
ROOMY = QueueLimits(max_tokens=100_000, max_tenant_tokens=100_000, budget_tokens=4096)
SMALL_PASSES = QueueLimits(max_tokens=100_000, max_tenant_tokens=100_000, budget_tokens=64)
PASSAGE = "Café au lait, s'il vous plaît! 東京 " * 3  # about 40 tokens: one text per pass of 64

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


def with_batcher(encoder: SentenceEncoder, limits: QueueLimits, work: Callable[[EmbeddingBatcher], Awaitable[T]]) -> T:
    async def run() -> T:
        batcher = EmbeddingBatcher(encoder, limits)
        batcher.start()
        try:
            return await work(batcher)
        finally:
            await batcher.stop()

    return asyncio.run(run())


async def first_pass_done(batcher: EmbeddingBatcher) -> None:
    while batcher.stats.num_passes == 0:
        await asyncio.sleep(0.005)


def test_requests_arriving_together_share_a_forward_pass(encoder: SentenceEncoder) -> None:
    requests = [["the sea"], ["a lake", "a river"], ["tax law"], ["x"]]

    async def work(batcher: EmbeddingBatcher) -> tuple[list[torch.Tensor], int]:
        results = await asyncio.gather(*(batcher.embed(texts) for texts in requests))
        return [r.vectors for r in results], batcher.stats.num_passes

    vectors, num_passes = with_batcher(encoder, ROOMY, work)
    assert num_passes < len(requests)
    for texts, got in zip(requests, vectors):
        assert torch.allclose(got, encoder.embed(texts).vectors, atol=1e-5)


def test_another_tenants_small_request_is_answered_before_a_big_batch(encoder: SentenceEncoder) -> None:
    big = [f"{i} {PASSAGE}" for i in range(12)]  # a pass each

    async def work(batcher: EmbeddingBatcher) -> tuple[list[str], torch.Tensor]:
        answered: list[str] = []

        async def embed(name: str, texts: list[str], tenant: str) -> torch.Tensor:
            vectors = (await batcher.embed(texts, tenant)).vectors
            answered.append(name)
            return vectors

        batch = asyncio.create_task(embed("big", big, "a"))
        await first_pass_done(batcher)
        await embed("small", ["two words"], "b")
        vectors = await batch
        return answered, vectors

    answered, vectors = with_batcher(encoder, SMALL_PASSES, work)
    assert answered == ["small", "big"]  # before: the small request waited for the whole batch
    assert torch.allclose(vectors, encoder.embed(big).vectors, atol=1e-5)  # split into passes, same vectors


def test_the_texts_of_a_caller_that_left_are_dropped(encoder: SentenceEncoder) -> None:
    async def work(batcher: EmbeddingBatcher) -> tuple[int, int, int]:
        gone = asyncio.create_task(batcher.embed([PASSAGE] * 12, "a"))
        await first_pass_done(batcher)
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone
        await batcher.embed(["x"], "a")  # the same tenant: behind the whole batch, had it stayed queued
        stats = batcher.stats
        return stats.num_texts_encoded, stats.num_texts_dropped, batcher.queue.num_waiting_tokens

    encoded, dropped, waiting = with_batcher(encoder, SMALL_PASSES, work)
    assert dropped > 0 and encoded + dropped == 13 and waiting == 0
