"""Embedding throughput through a real `edgerun backend --engine embedding` (all-MiniLM-L6-v2).

The same texts are embedded three ways, in rounds that alternate between them (the machine's load
drifts; every round sees each way once):

- `one_by_one`: one request per text, each waiting for the previous (batch 1);
- `concurrent`: one request per text, all in flight at once (the backend's batcher merges them);
- `batched`: one request carrying every text (`input` a list).

Reports inputs/s and tokens/s (tokens as the backend bills them, `usage.prompt_tokens`) per way,
median over rounds, and the ratio to `one_by_one`. Prints one JSON object.

    python -m benchmarks.backend.embeddings --texts 64 --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx

from cli.processes import ChildProcess

KEY = "embedding-benchmark-secret-0123456789"
TOPICS = ("the sea at dawn", "tax law for small firms", "a recipe for bread", "graph algorithms", "mountain weather")


def texts(count: int) -> list[str]:
    """Short sentences of a few lengths, as search queries and passages look."""
    return [f"Sentence {i} is about {TOPICS[i % len(TOPICS)]}" + " and more" * (i % 7) for i in range(count)]


async def embed(client: httpx.AsyncClient, inputs: str | list[str]) -> int:
    response = await client.post("/v1/embeddings", json={"model": "all-minilm-l6-v2", "input": inputs})
    response.raise_for_status()
    return int(response.json()["usage"]["prompt_tokens"])


async def one_by_one(client: httpx.AsyncClient, batch: list[str]) -> int:
    return sum([await embed(client, text) for text in batch])


async def concurrent(client: httpx.AsyncClient, batch: list[str]) -> int:
    return sum(await asyncio.gather(*(embed(client, text) for text in batch)))


async def batched(client: httpx.AsyncClient, batch: list[str]) -> int:
    return await embed(client, batch)


WAYS: dict[str, Callable[[httpx.AsyncClient, list[str]], Awaitable[int]]] = {
    "one_by_one": one_by_one,
    "concurrent": concurrent,
    "batched": batched,
}


async def measure(url: str, count: int, rounds: int) -> dict[str, Any]:
    batch = texts(count)
    seconds: dict[str, list[float]] = {name: [] for name in WAYS}
    tokens: dict[str, int] = {}
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(base_url=url, headers={"authorization": f"Bearer {KEY}"}, timeout=300, limits=limits) as client:
        await batched(client, batch)  # warm-up
        for _ in range(rounds):
            for name, way in WAYS.items():
                started = time.perf_counter()
                tokens[name] = await way(client, batch)
                seconds[name].append(time.perf_counter() - started)
    base = statistics.median(seconds["one_by_one"])
    result: dict[str, Any] = {}
    for name in WAYS:
        median = statistics.median(seconds[name])
        result[name] = {
            "inputs_per_s": round(count / median, 1),
            "tokens_per_s": round(tokens[name] / median, 1),
            "speedup_vs_one_by_one": round(base / median, 2),
            "seconds_min_median_max": [round(min(seconds[name]), 3), round(median, 3), round(max(seconds[name]), 3)],
        }
    return {"texts": count, "tokens": tokens["batched"], "rounds": rounds, "ways": result}


@contextlib.contextmanager
def embedding_backend() -> Iterator[ChildProcess]:
    """`edgerun backend --engine embedding` with its default settings, ready; stopped at the end."""
    options = ["--engine", "embedding", "--log-level", "warning"]
    backend = ChildProcess.spawn("embedding backend", "backend", options, env={"EDGERUN_API_KEY": KEY})
    try:
        backend.wait_ready("/health", timeout_s=180)
        yield backend
    finally:
        backend.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--texts", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with embedding_backend() as backend:
        load_before = os.getloadavg()
        report = asyncio.run(measure(backend.url, args.texts, args.rounds))
    print(json.dumps({**report, "load_average": [load_before, os.getloadavg()]}, indent=1))


if __name__ == "__main__":
    main()
