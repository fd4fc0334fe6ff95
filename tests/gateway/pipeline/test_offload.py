"""The offload pool: large inputs leave the event loop, the queue is bounded, small ones stay inline."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

import pytest

from gateway.errors import OutOfCapacity
from gateway.fleet.catalog import ModelSpec
from gateway.pipeline.offload import Offload
from gateway.pipeline.schemas import Prompt
from gateway.pipeline.tokenization import ModelTokenizer
from tests.gateway.fixtures_tokenizer import payload

T = TypeVar("T")


class CountingOffload(Offload):
    def __init__(self) -> None:
        super().__init__(threads=1)
        self.threads: list[str] = []

    async def run(self, fn: Callable[[], T]) -> T:
        def recorded() -> T:
            self.threads.append(threading.current_thread().name)
            return fn()

        return await super().run(recorded)


async def test_large_prompts_are_templated_and_tokenized_on_the_pool() -> None:
    tok = ModelTokenizer.from_payload(ModelSpec(id="@cf/test/tiny", backend_model="tiny"), payload())
    offload = CountingOffload()
    try:
        small = Prompt(messages=({"role": "user", "content": "the quick fox"},))
        assert await tok.encode(small, offload) == await tok.encode(small)
        assert offload.threads == []  # a thread hop costs more than a small prompt
        large = Prompt(messages=({"role": "user", "content": "the quick fox " * 1000},))
        assert await tok.encode(large, offload) == tok.encode_prompt(large)
        assert len(offload.threads) == 1 and offload.threads[0].startswith("edgerun-offload")
        text, _ = tok.render(large)  # large texts go through encode_batch (it releases the GIL): same ids
        assert tok.encode_text(text) == tok.tokenizer.encode(text, add_special_tokens=False).ids
    finally:
        offload.close()


async def test_a_full_queue_refuses_at_once_with_429() -> None:
    offload = Offload(threads=1, max_pending=1)
    release = threading.Event()
    try:
        busy = asyncio.ensure_future(offload.run(lambda: release.wait(10)))
        await asyncio.sleep(0.05)
        with pytest.raises(OutOfCapacity) as refused:
            await offload.run(lambda: None)
        assert refused.value.status == 429 and refused.value.retry_after_s == 1.0
        release.set()
        assert await busy is True
        assert offload.pending == 0
        assert await offload.run(lambda: 7) == 7
    finally:
        release.set()
        offload.close()
