"""Requests that arrive together are encoded together: one forward pass for many small requests.

`EmbeddingBatcher.embed(texts)` queues the request; one worker task (started and stopped by its
owner, the backend app's lifespan) takes every request waiting, up to `max_texts` texts (a request
larger than that goes alone), encodes them in one `SentenceEncoder.embed` call in a worker thread
(which pads them into batches of the encoder's `max_batch`), and hands each request its own rows.
A vector does not depend on its batch (padding is masked), so batching changes only throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field

from engines.embedding.encoder import Embeddings, SentenceEncoder


@dataclass(slots=True)
class _Pending:
    texts: list[str]
    done: asyncio.Future[Embeddings] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class EmbeddingBatcher:
    def __init__(self, encoder: SentenceEncoder, max_texts: int = 256) -> None:
        self.encoder = encoder
        self.max_texts = max_texts
        self.num_batches = 0  # forward calls made: fewer than requests when they were batched
        self._waiting: deque[_Pending] = deque()
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._worker = asyncio.create_task(self._run(), name="edgerun-embedding-batcher")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        while self._waiting:
            self._waiting.popleft().done.cancel()

    async def embed(self, texts: list[str]) -> Embeddings:
        pending = _Pending(list(texts))
        self._waiting.append(pending)
        self._wakeup.set()
        return await pending.done

    def _next_batch(self) -> list[_Pending]:
        """The oldest request, and those after it while the texts fit in `max_texts`."""
        batch = [self._waiting.popleft()]
        size = len(batch[0].texts)
        while self._waiting and size + len(self._waiting[0].texts) <= self.max_texts:
            batch.append(self._waiting.popleft())
            size += len(batch[-1].texts)
        return [p for p in batch if not p.done.cancelled()]  # a cancelled one's client has left

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._waiting:
                await self._encode(self._next_batch())

    async def _encode(self, batch: list[_Pending]) -> None:
        if not batch:
            return
        try:
            result = await asyncio.to_thread(self.encoder.embed, [t for p in batch for t in p.texts])
        except Exception as exc:  # these requests fail; the worker lives on
            for pending in batch:
                if not pending.done.done():
                    pending.done.set_exception(exc)
            return
        self.num_batches += 1
        start = 0
        for pending in batch:
            end = start + len(pending.texts)
            if not pending.done.done():
                pending.done.set_result(Embeddings(result.vectors[start:end], result.num_tokens[start:end]))
            start = end
