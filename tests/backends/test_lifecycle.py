"""Overload and graceful shutdown of a real backend process (a small one: 2 running, no queue)."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.backends.conftest import BackendProcess, long_prompt_ids, running_backend

pytestmark = pytest.mark.slow
SHUTDOWN_TIMEOUT_S = 8.0


@pytest.fixture(scope="module")
def backend() -> Iterator[BackendProcess]:
    flags = ("--max-num-seqs", "2", "--max-queue", "0", "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S))
    with running_backend(*flags) as process:
        yield process


def long_stream(offset: int, max_tokens: int = 4000) -> dict:
    prompt = long_prompt_ids(16, offset=offset)
    return {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


async def read_stream(response: httpx.Response, started: asyncio.Event | None = None) -> list[dict | str]:
    events: list[dict | str] = []
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
            if started is not None:
                started.set()
    return events


async def test_overload_answers_429_with_retry_after(backend: BackendProcess) -> None:
    async with httpx.AsyncClient(base_url=backend.url, timeout=60) as client:
        async with client.stream("POST", "/v1/completions", json=long_stream(1)) as first, \
                client.stream("POST", "/v1/completions", json=long_stream(2)) as second:
            assert first.status_code == second.status_code == 200
            started = time.monotonic()
            refused = await client.post("/v1/completions", json={"prompt": "one more", "max_tokens": 4})
            assert time.monotonic() - started < 5.0  # refused at once, not parked until a slot frees (minutes away)
            assert refused.status_code == 429
            assert float(refused.headers["retry-after"]) > 0
            error = refused.json()["error"]
            assert error["type"] == "rate_limit_error" and error["code"] == 429
    await asyncio.to_thread(backend.wait_until, lambda load: load["in_flight"] == 0, 15)
    assert 'outcome="overloaded"' in httpx.get(f"{backend.url}/metrics").text


async def test_sigterm_drains_then_exits(backend: BackendProcess) -> None:
    async with httpx.AsyncClient(base_url=backend.url, timeout=60) as client:
        async with client.stream("POST", "/v1/completions", json=long_stream(3, max_tokens=3)) as short, \
                client.stream("POST", "/v1/completions", json=long_stream(4)) as endless:
            short_started, endless_started = asyncio.Event(), asyncio.Event()
            short_task = asyncio.create_task(read_stream(short, short_started))
            endless_task = asyncio.create_task(read_stream(endless, endless_started))
            await asyncio.wait_for(asyncio.gather(short_started.wait(), endless_started.wait()), 30)
            signalled_at = time.monotonic()
            backend.process.send_signal(signal.SIGTERM)

            for _ in range(100):  # the signal handler hands the drain to the event loop
                health = await client.get("/health")
                if health.status_code == 503:
                    break
                await asyncio.sleep(0.1)
            assert health.status_code == 503 and health.json()["status"] == "draining"
            refused = await client.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
            assert refused.status_code == 503

            short_events = await asyncio.wait_for(short_task, 30)
            endless_events = await asyncio.wait_for(endless_task, 30)

    # the short stream finished normally while draining
    assert short_events[-1] == "[DONE]"
    assert short_events[-2]["usage"]["completion_tokens"] == 3
    assert short_events[-3]["choices"][0]["finish_reason"] == "length"
    # the endless one was aborted at the deadline but still ended cleanly, with its usage
    assert endless_events[-1] == "[DONE]"
    assert endless_events[-3]["choices"][0]["finish_reason"] == "abort"
    assert 0 < endless_events[-2]["usage"]["completion_tokens"] < 4000

    exit_code = await asyncio.to_thread(backend.process.wait, SHUTDOWN_TIMEOUT_S + 15)
    assert exit_code == 0, backend.log()[-2000:]
    assert time.monotonic() - signalled_at < SHUTDOWN_TIMEOUT_S + 15
