"""AsyncEngine: the worker thread, concurrency, cancellation and shutdown, with the real model."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from engines.base import GenerationOutput, GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.async_engine import AsyncEngine
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.runner.model_runner import ModelRunner
from engines.errors import EngineStopped, InvalidRequest
from engines.sampling_params import SamplingParams

TOPICS = ["rain", "chess", "bread", "volcanoes", "jazz", "bees", "trains", "glass", "owls", "tea", "maps", "snow"]


def config(**overrides: object) -> EngineConfig:
    return EngineConfig(**{"block_size": 16, "num_kv_blocks": 256, **overrides})


def chat(runner: ModelRunner, text: str) -> list[int]:
    tok = runner.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def greedy(request_id: str, prompt: list[int], max_tokens: int) -> GenerationRequest:
    return GenerationRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


async def collect(engine: AsyncEngine, request: GenerationRequest) -> list[GenerationOutput]:
    return [output async for output in engine.generate(request)]


def alone(runner: ModelRunner, request: GenerationRequest) -> list[int]:
    engine = LLMEngine(config(), runner)
    engine.add_request(request)
    tokens = []
    while engine.has_unfinished:
        tokens += [t for o in engine.step() for t in o.new_token_ids]
    return tokens


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_concurrent_requests_match_their_solo_runs(smollm2_fast_runner: ModelRunner) -> None:
    # 12 requests, prompts of different lengths (1-3 sentences) and max_tokens 4..10.
    requests = [
        greedy(f"r{i}", chat(smollm2_fast_runner, f"Write about {topic}. " * (1 + i % 3)), max_tokens=4 + i % 7)
        for i, topic in enumerate(TOPICS)
    ]
    expected = {r.request_id: alone(smollm2_fast_runner, r) for r in requests}
    engine = AsyncEngine(config(max_num_batched_tokens=128), smollm2_fast_runner)
    await engine.start()
    ticks: list[float] = []

    async def ticker() -> None:  # the event loop must stay responsive while the model runs
        while True:
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    tick_task = asyncio.create_task(ticker())
    try:
        results = await asyncio.gather(*(collect(engine, r) for r in requests))
    finally:
        tick_task.cancel()
        await engine.stop()
    got = {outs[0].request_id: [t for o in outs for t in o.new_token_ids] for outs in results}
    assert got == expected
    assert all(outs[-1].finish_reason == "length" for outs in results)
    assert max(b - a for a, b in zip(ticks, ticks[1:])) < 0.5
    stats = engine.stats()
    assert stats.num_kv_blocks_free == stats.num_kv_blocks_total
    assert stats.num_generated_tokens == sum(4 + i % 7 for i in range(12))


async def test_leaving_the_iteration_or_abort_frees_blocks(smollm2_fast_runner: ModelRunner) -> None:
    engine = AsyncEngine(config(), smollm2_fast_runner)
    await engine.start()
    prompt = chat(smollm2_fast_runner, "Tell me a long story about a dragon.")
    try:
        async for output in engine.generate(greedy("leaver", prompt, max_tokens=200)):
            if output.num_generated_tokens == 2:
                break
        await wait_for(lambda: engine.stats().num_running == 0)
        stats = engine.stats()
        assert stats.num_kv_blocks_free == stats.num_kv_blocks_total
        assert stats.num_generated_tokens <= 4  # aborted before running on

        seen: list[GenerationOutput] = []

        async def consume() -> None:
            async for output in engine.generate(greedy("aborted", prompt, max_tokens=200)):
                seen.append(output)

        task = asyncio.create_task(consume())
        await wait_for(lambda: len(seen) >= 1)
        await engine.abort("aborted")
        stats = engine.stats()
        assert stats.num_kv_blocks_free == stats.num_kv_blocks_total  # freed when abort() returns
        await asyncio.wait_for(task, 5)
        assert seen[-1].finish_reason == "abort"

        task = asyncio.create_task(collect(engine, greedy("cancelled", prompt, max_tokens=200)))
        await wait_for(lambda: engine.stats().num_running == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: engine.stats().num_running == 0)
        assert engine.stats().num_kv_blocks_free == engine.stats().num_kv_blocks_total
        # The engine keeps serving after all that.
        outputs = await collect(engine, greedy("after", prompt, max_tokens=3))
        assert outputs[-1].num_generated_tokens == 3
    finally:
        await engine.stop()


async def test_errors_idle_and_stop(smollm2_fast_runner: ModelRunner) -> None:
    engine = AsyncEngine(config(num_kv_blocks=16), smollm2_fast_runner)
    with pytest.raises(EngineStopped):
        await collect(engine, greedy("early", [1, 2], max_tokens=2))
    await engine.start()
    with pytest.raises(InvalidRequest, match="empty"):
        await collect(engine, greedy("empty", [], max_tokens=2))
    # Idle: the worker sleeps on its condition variable instead of spinning.
    cpu_before = time.process_time()
    await asyncio.sleep(0.5)
    assert time.process_time() - cpu_before < 0.1
    prompt = chat(smollm2_fast_runner, "Tell me a long story about a dragon.")
    running = asyncio.create_task(collect(engine, greedy("long", prompt, max_tokens=150)))
    await wait_for(lambda: engine.stats().num_generated_tokens >= 1)
    started = time.monotonic()
    await engine.stop(timeout_s=0.3)  # too short to finish: the request is aborted
    assert time.monotonic() - started < 3
    outputs = await asyncio.wait_for(running, 1)
    assert outputs[-1].finish_reason == "abort"
    assert engine.stats().num_kv_blocks_free == 16
    with pytest.raises(EngineStopped):
        await collect(engine, greedy("late", [1, 2], max_tokens=2))
