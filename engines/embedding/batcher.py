"""Embedding requests encoded a pass at a time, shared fairly between tenants.

`EmbeddingBatcher.embed(texts, tenant)` reserves room in a `FairQueue`
(engines/embedding/fair_queue.py) for an upper bound of the texts' tokens (a WordPiece token
covers at least one UTF-8 byte, [CLS] and [SEP] are added, and a text is truncated to the
encoder's `max_seq_length`), which refuses them when its bounds are reached, then tokenizes them
(on the default executor: the Rust tokenizer, no torch) and queues them at their real count.
One worker task, started and stopped by its owner (the backend app's lifespan), takes pass after
pass from the queue - texts of every tenant with work waiting, in turn, up to the pass's token
budget - and encodes each in one `embed_ids` call on the batcher's one encoding thread (so one
OpenMP team serves every pass: engines/omp.py). A request is answered once its last pass is
done. A caller that leaves (its `embed` is cancelled) has its texts not yet taken dropped before
the next pass; the pass under way finishes and its rows for that caller are thrown away. A
vector does not depend on its batch (padding is masked), so how requests are split and merged
changes only latency and throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from torch import Tensor

from engines.embedding.encoder import Embeddings, SentenceEncoder
from engines.embedding.fair_queue import FairQueue, Job, QueueLimits, Slice
from engines.errors import EngineError


@dataclass(slots=True)
class BatcherStats:
    num_passes: int = 0  # forward passes run: fewer than requests when small ones were merged
    num_texts_encoded: int = 0
    num_texts_dropped: int = 0  # their caller left before they were encoded
    num_refused: int = 0  # requests the queue's bounds refused


@dataclass(eq=False, slots=True)
class _Waiting:
    job: Job
    done: asyncio.Future[Embeddings]
    rows: list[Tensor] = field(default_factory=list)  # vectors of the passes done, in text order
    num_done: int = 0


class EmbeddingBatcher:
    def __init__(self, encoder: SentenceEncoder, limits: QueueLimits) -> None:
        self.encoder = encoder
        self.queue = FairQueue(limits)
        self.stats = BatcherStats()
        self._waiting: dict[Job, _Waiting] = {}
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgerun-embed")

    def start(self) -> None:
        self._worker = asyncio.create_task(self._run(), name="edgerun-embedding-batcher")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        for waiting in list(self._waiting.values()):
            waiting.done.cancel()
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def embed(self, texts: list[str], tenant: str = "") -> Embeddings:
        """The texts' vectors and token counts; raises EngineOverloaded / InvalidRequest when the
        queue refuses them (engines/embedding/fair_queue.py)."""
        bound = sum(min(len(text.encode()) + 2, self.encoder.max_seq_length) for text in texts)
        try:
            held = self.queue.reserve(tenant, bound)  # before tokenizing: a refusal costs nothing
        except EngineError:
            self.stats.num_refused += 1
            raise
        try:
            ids = await asyncio.to_thread(self.encoder.tokenize, texts)
            job = Job(tenant, ids)
            self.queue.push(job, held)
        except BaseException as exc:
            self.queue.release(tenant, held)
            self.stats.num_refused += isinstance(exc, EngineError)
            raise
        waiting = self._waiting[job] = _Waiting(job, asyncio.get_running_loop().create_future())
        self._wakeup.set()
        try:
            return await waiting.done
        except asyncio.CancelledError:  # the caller has gone
            self.stats.num_texts_dropped += len(ids) - job.num_taken
            self.queue.discard(job)
            raise
        finally:
            del self._waiting[job]

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while slices := self.queue.take():
                await self._encode(slices)

    async def _encode(self, slices: list[Slice]) -> None:
        ids = [row for s in slices for row in s.job.ids[s.start : s.stop]]
        loop = asyncio.get_running_loop()
        try:
            vectors = await loop.run_in_executor(self._thread, self.encoder.embed_ids, ids)
        except Exception as exc:  # these requests fail; the worker lives on
            for s in slices:
                self._fail(s.job, exc)
            return
        self.stats.num_passes += 1
        self.stats.num_texts_encoded += len(ids)
        start = 0
        for s in slices:
            stop = start + s.stop - s.start
            self._deliver(s.job, vectors[start:stop])
            start = stop

    def _deliver(self, job: Job, rows: Tensor) -> None:
        waiting = self._waiting.get(job)
        if waiting is None or waiting.done.done():  # its caller has gone
            return
        waiting.rows.append(rows)
        waiting.num_done += len(rows)
        if waiting.num_done == len(job.ids):
            waiting.done.set_result(Embeddings(torch.cat(waiting.rows), [len(row) for row in job.ids]))

    def _fail(self, job: Job, exc: Exception) -> None:
        self.queue.discard(job)  # the rest of its texts would be answered to no one
        waiting = self._waiting.get(job)
        if waiting is not None and not waiting.done.done():
            waiting.done.set_exception(exc)
