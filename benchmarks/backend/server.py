"""What the HTTP server costs: the same streams through the backend server vs the engine in-process.

    python -m benchmarks.backend.server [--model smollm2] [--device cpu] [--concurrency 1 16]

Loads the engine in this process (AsyncEngine) and starts a backend server process with the
same engine settings, then, for each concurrency level, runs the same prompts through both, in
interleaved rounds: in-process (`engine.generate`) and over HTTP (BackendClient, streaming, SSE).
Every request generates exactly `--max-tokens` tokens (greedy, ignore_eos); each round uses a
fresh cache_salt so neither side reuses the other's prefix cache. Prints a markdown table:
throughput (generated tokens/s over the round's wall time), mean TTFT, CPU time per generated
token (in-process: this process; server: the server process plus this process, i.e. the client),
and the server/in-process ratios. On a shared machine wall-clock figures move with the
neighbours' load; CPU time per token is the steadier measure of what the server adds.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import shlex
import signal
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from backends.client import BackendClient, Endpoint
from benchmarks.common import interleave, machine, process_cpu_s
from cli.processes import ChildProcess
from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.omp import may_bound_omp_spinning, on_own_thread
from engines.sampling_params import SamplingParams


@dataclass(slots=True)
class Round:
    tokens: int
    wall_s: float
    ttfts_s: list[float]
    cpu_s: float

    @property
    def cpu_ms_per_token(self) -> float:
        return 1000 * self.cpu_s / self.tokens

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


@dataclass(slots=True)
class Summary:
    tokens_per_s: float
    ttft_ms: float
    cpu_ms_per_token: float

    @classmethod
    def of(cls, rounds: list[Round]) -> Summary:
        return cls(
            tokens_per_s=statistics.median(r.tokens_per_s for r in rounds),
            ttft_ms=1000 * statistics.median(statistics.fmean(r.ttfts_s) for r in rounds),
            cpu_ms_per_token=statistics.median(r.cpu_ms_per_token for r in rounds),
        )


OneRequest = Callable[[list[int], str], Awaitable[tuple[int, float]]]  # prompt, salt -> (tokens, ttft)


async def run_round(
    one: OneRequest, prompts: list[list[int]], concurrency: int, cpu: Callable[[], float] = time.process_time
) -> Round:
    """`concurrency` streams, each sending its share of `prompts` one after another."""
    salt = uuid.uuid4().hex
    ttfts: list[float] = []
    tokens = 0

    async def stream(index: int) -> None:
        nonlocal tokens
        for prompt in prompts[index::concurrency]:
            n, ttft = await one(prompt, salt)
            tokens += n
            ttfts.append(ttft)

    started, cpu_started = time.perf_counter(), cpu()
    await asyncio.gather(*(stream(i) for i in range(concurrency)))
    return Round(tokens, time.perf_counter() - started, ttfts, cpu() - cpu_started)


def in_process(engine, sampling: SamplingParams) -> OneRequest:  # noqa: ANN001
    async def one(prompt: list[int], salt: str) -> tuple[int, float]:
        started = time.perf_counter()
        ttft, count = 0.0, 0
        request = GenerationRequest(f"bench-{uuid.uuid4().hex}", prompt, sampling, salt)
        async for output in engine.generate(request):
            if count == 0 and output.new_token_ids:
                ttft = time.perf_counter() - started
            count = output.num_generated_tokens
        return count, ttft

    return one


def over_http(client: BackendClient, endpoint: Endpoint, sampling: SamplingParams) -> OneRequest:
    async def one(prompt: list[int], salt: str) -> tuple[int, float]:
        body = {"prompt": prompt, "max_tokens": sampling.max_tokens, "temperature": 0.0, "ignore_eos": True,
                "cache_salt": salt}
        started = time.perf_counter()
        ttft, count = 0.0, 0
        async for chunk in client.stream_completion(endpoint, body):
            if ttft == 0.0 and chunk.usage is None:  # the first chunk carries the first token
                ttft = time.perf_counter() - started
            if chunk.usage is not None:
                count = chunk.usage.completion_tokens
        return count, ttft

    return one


def start_server(args: argparse.Namespace) -> ChildProcess:
    options = [
        "--model", args.model, "--device", args.device, "--dtype", args.dtype, "--num-kv-blocks", str(args.num_kv_blocks),
        "--max-num-seqs", str(max(args.concurrency)), "--max-queue", "64", "--log-level", "warning",
    ]
    return ChildProcess.spawn("backend", "backend", options, keep_edgerun_env=True, threads=args.threads)


def print_header(args: argparse.Namespace) -> None:
    print(f"Command: `python -m benchmarks.backend.server {shlex.join(sys.argv[1:])}`")
    threads = f", torch threads per engine: {args.threads}" if args.threads else ""
    print(f"Machine: {machine(with_torch=True)}{threads}")
    print(f"Workload: {args.prompt_tokens}-token prompts, {args.max_tokens} generated tokens each (greedy, "
          f"ignore_eos), {args.requests_per_stream} requests per stream, median of {args.rounds} alternating rounds\n")
    print("| streams | in-process tok/s | server tok/s | server/in-process | in-process TTFT ms | server TTFT ms "
          "| in-process CPU ms/token | server+client CPU ms/token | CPU ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)


def print_row(concurrency: int, local: Summary, remote: Summary) -> None:
    print(f"| {concurrency} | {local.tokens_per_s:.1f} | {remote.tokens_per_s:.1f} | "
          f"{remote.tokens_per_s / local.tokens_per_s:.3f} | {local.ttft_ms:.0f} | {remote.ttft_ms:.0f} | "
          f"{local.cpu_ms_per_token:.1f} | {remote.cpu_ms_per_token:.1f} | "
          f"{remote.cpu_ms_per_token / local.cpu_ms_per_token:.3f} |", flush=True)


async def main(args: argparse.Namespace) -> int:
    may_bound_omp_spinning()  # as the backend does: both sides spin alike
    import torch

    from engines.builtin.engine.async_engine import AsyncEngine

    if args.threads:
        torch.set_num_threads(args.threads)

    rng = random.Random(0)
    num_prompts = max(args.concurrency) * args.requests_per_stream
    prompts = [[rng.randrange(1000, 30000) for _ in range(args.prompt_tokens)] for _ in range(num_prompts)]
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    config = EngineConfig(model=args.model, device=args.device, dtype=args.dtype, num_kv_blocks=args.num_kv_blocks,
                          max_num_seqs=max(args.concurrency))

    server = start_server(args)
    client = BackendClient(read_timeout_s=600, first_byte_timeout_s=600)
    endpoint = Endpoint(id="bench", base_url=server.url, region="local")
    engine = None
    try:
        engine = await on_own_thread(AsyncEngine, config)  # not here: one OpenMP team only (engines/omp.py)
        await engine.start()
        server.wait_ready("/health", timeout_s=600)
        local, remote = in_process(engine, sampling), over_http(client, endpoint, sampling)

        def remote_cpu() -> float:
            return process_cpu_s(server.process.pid) + time.process_time()

        for one in (local, remote):  # warm-up: first forwards, allocator, connections
            await run_round(one, prompts[: max(args.concurrency)], max(args.concurrency))
        print_header(args)
        for concurrency in args.concurrency:
            batch = prompts[: concurrency * args.requests_per_stream]
            paired = await interleave(
                functools.partial(run_round, local, batch, concurrency),
                functools.partial(run_round, remote, batch, concurrency, remote_cpu),
                args.rounds,
            )
            print_row(concurrency, Summary.of(paired.baseline), Summary.of(paired.subject))
    finally:
        server.stop(timeout_s=60)
        await client.aclose()
        if engine is not None:
            await engine.stop()
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.backend.server", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-per-stream", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads for both engines (default: torch's); on a small machine, 1 leaves "
                             "a core to the HTTP server and client instead of oversubscribing the cores")
    return parser.parse_args(argv)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds main(), which stops the server it started


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    sys.exit(asyncio.run(main(parse_args(sys.argv[1:]))))
