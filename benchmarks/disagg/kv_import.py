"""Does importing KV stall a decode backend's streams? The same streams with and without pulls.

    python -m benchmarks.disagg.kv_import [--rounds 3] [--duration 20] [--import-rate 0.5] [--import-tokens 1000]

Two real backends (SmolLM2-135M, one torch thread each, each pinned to its own core): the
prefill one runs the context steps of unique `--import-tokens`-token prompts up front (their KV
stays pinned), the decode one serves `--streams` steady streams (64-token answers, back to back,
straight to its /v1/completions). In the subject phases generation_only requests arrive on a
Poisson clock of `--import-rate` per second, each pulling one pinned prompt's KV over the
built-in TCP transport and decoding one more token; the baseline phases run the streams alone.
Phases alternate (benchmarks/common.py). If the pull stalled the engine, the streams'
inter-token gaps would grow by about the pull's duration while it runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.common import interleave, machine
from benchmarks.disagg.serving import pct, start_backend


@dataclass
class Phase:
    itl_s: list[float] = field(default_factory=list)
    import_s: list[float] = field(default_factory=list)  # generation_only request: pull + one token
    errors: int = 0

    def __add__(self, other: Phase) -> Phase:
        return Phase(self.itl_s + other.itl_s, self.import_s + other.import_s, self.errors + other.errors)


async def context_step(client: httpx.AsyncClient, url: str, prompt: str) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0.0, "ignore_eos": True,
            "disaggregated_params": {"request_type": "context_only"}}
    answer = (await client.post(f"{url}/v1/completions", json=body)).json()
    params = answer["choices"][0]["disaggregated_params"]
    return {"prompt": answer["prompt_token_ids"], "max_tokens": 2, "temperature": 0.0, "ignore_eos": True,
            "disaggregated_params": {**params, "request_type": "generation_only"}}


async def steady_stream(client: httpx.AsyncClient, url: str, i: int, deadline: float, phase: Phase) -> None:
    n = 0
    while time.perf_counter() < deadline:
        body = {"prompt": f"Stream {i}.{n}: count slowly from one to one hundred, in words.", "max_tokens": 64,
                "temperature": 0.0, "ignore_eos": True, "stream": True}
        last = None
        async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                if not json.loads(line[6:]).get("choices"):
                    continue
                now = time.perf_counter()
                if last is not None:
                    phase.itl_s.append(now - last)
                last = now
        n += 1


async def run_phase(decode_url: str, args: argparse.Namespace, imports: list[dict[str, Any]], seed: int) -> Phase:
    phase = Phase()
    rng = random.Random(seed)
    deadline = time.perf_counter() + args.duration
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:

        async def one_import(body: dict[str, Any]) -> None:
            started = time.perf_counter()
            response = await client.post(f"{decode_url}/v1/completions", json=body)
            if response.status_code != 200:
                phase.errors += 1
                print(f"import: {response.status_code} {response.text[:200]}", file=sys.stderr)
                return
            phase.import_s.append(time.perf_counter() - started)

        async def arrivals() -> None:
            tasks = []
            while imports and (now := time.perf_counter()) < deadline:
                await asyncio.sleep(min(rng.expovariate(args.import_rate), max(0.0, deadline - now)))
                if time.perf_counter() < deadline:
                    tasks.append(asyncio.create_task(one_import(imports.pop())))
            await asyncio.gather(*tasks)

        streams = [steady_stream(client, decode_url, i, deadline, phase) for i in range(args.streams)]
        await asyncio.gather(*streams, *([arrivals()] if args.import_rate else []))
    return phase


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.disagg.kv_import", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per phase")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--import-rate", type=float, default=0.5, help="imports per second in the subject phases")
    parser.add_argument("--import-tokens", type=int, default=1000, help="about this many prompt tokens per import")
    parser.add_argument("--cores", default="0,1")
    args = parser.parse_args(argv)
    cores = [int(c) for c in args.cores.split(",")]
    num_imports = int(args.rounds * args.duration * args.import_rate * 1.5) + 2
    env = {"EDGERUN_KV_PIN_TTL_S": "3600"}
    prefill = start_backend("bk-prefill", cores[0], 8192, env)
    decode = start_backend("bk-decode", cores[1], 4096, env)
    try:
        for backend in (prefill, decode):
            backend.wait_ready("/health", 300)

        async def run_all() -> tuple[Phase, Phase, float]:
            rng = random.Random(7)
            prompts = [" ".join(str(rng.randrange(10, 99)) for _ in range(args.import_tokens // 3))
                       for _ in range(num_imports)]
            started = time.perf_counter()
            async with httpx.AsyncClient(timeout=httpx.Timeout(900.0)) as client:
                imports = list(await asyncio.gather(*(context_step(client, prefill.url, p) for p in prompts)))
            print(f"{num_imports} context steps in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            await run_phase(decode.url, argparse.Namespace(**{**vars(args), "duration": 5.0, "import_rate": 0}), [], 0)
            seeds = iter(range(100, 200))
            paired = await interleave(
                lambda: run_phase(decode.url, argparse.Namespace(**{**vars(args), "import_rate": 0}), [], 0),
                lambda: run_phase(decode.url, args, imports, next(seeds)),
                args.rounds,
            )
            base, subject = paired.baseline[0], paired.subject[0]
            for b, s in zip(paired.baseline[1:], paired.subject[1:], strict=True):
                base, subject = base + b, subject + s
            return base, subject, len(prompts[0].split()) * 3

        base, subject, tokens = asyncio.run(run_all())
    finally:
        for backend in (decode, prefill):
            backend.stop(timeout_s=15)
    print(f"`python -m benchmarks.disagg.kv_import {' '.join(argv if argv is not None else sys.argv[1:])}`")
    print(f"\nMachine: {machine(with_torch=True)}. ~{tokens}-token imports at {args.import_rate:g}/s, {args.streams} streams, "
          f"{args.rounds} interleaved rounds of {args.duration:g} s.\n")
    print("| decode backend's streams | no imports | with imports | ratio |\n|---|---|---|---|")
    for label, q in (("ITL p50", 0.5), ("ITL p90", 0.9), ("ITL p99", 0.99), ("longest gap", 1.0)):
        b, s = 1e3 * pct(base.itl_s, q), 1e3 * pct(subject.itl_s, q)
        print(f"| {label} | {b:.0f} ms | {s:.0f} ms | {s / b:.2f}x |")
    print(f"| tokens streamed | {len(base.itl_s)} | {len(subject.itl_s)} | |")
    print(f"\nImports: {len(subject.import_s)} done, {subject.errors} errors; request time (pull + one token) "
          f"p50 {1e3 * pct(subject.import_s, 0.5):.0f} ms, p90 {1e3 * pct(subject.import_s, 0.9):.0f} ms.")
    return 0 if base.errors + subject.errors == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
