"""Batch-1 decode at three depths of the serving path, interleaved: where does HTTP lose speed?

    python -m benchmarks.backend.serving_path [--rounds 3] [--max-tokens 64] [--threads 2] [--baseline CHECKOUT]
                                      [--engine-arg=--mode --engine-arg=deterministic]

Each round generates one greedy stream of `--max-tokens` tokens (ignore_eos) from the same random
`--prompt-tokens` prompt (a fresh cache salt each time, so every prefill is cold) three ways:

- engine: `LLMEngine.step()` called in a loop in this process (what the in-process benchmarks time);
- async: `AsyncEngine.generate()` in this process: the engine's worker thread, the hand-off to the
  event loop and the per-request queue, no HTTP;
- http: `edgerun backend` as a child process, read as an OpenAI stream with httpx (what
  benchmarks/backend/llamacpp.py measures); with `--baseline`, also a backend served from another checkout
  (before/after a change, in the same run).

The first two share one loaded model; the child loads its own, with the same settings and the same
number of torch threads (`--threads`, also this process's) and OpenMP spin count. Reported per depth (medians over
rounds): decode tok/s (tokens after the first over the time from first to last), the CPU time per
generated token of the process doing the work (this process for engine/async, the child for http),
and that process's sleeps per token (voluntary context switches of all its threads), which showed
the served engine's OpenMP threads sleeping at every parallel op (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shlex
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.common import machine, process_cpu_s
from cli.processes import ChildProcess


@dataclass(slots=True)
class Sample:
    decode_tok_s: float
    cpu_ms_per_token: float
    sleeps_per_token: float  # voluntary context switches of the working process's threads per token


def sleeps(pid: int) -> int:
    """Voluntary context switches (a thread blocked: a futex wait, I/O) of all threads of `pid`."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches"):
                    total += int(line.split()[1])
    return total


def decode_rate(token_times: list[float], num_tokens: int) -> float:
    span = token_times[-1] - token_times[0]
    return (num_tokens - 1) / span if span > 0 else float("nan")


def run_engine(engine: object, prompt: list[int], max_tokens: int) -> Sample:
    from engines.base import GenerationRequest
    from engines.sampling_params import SamplingParams

    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine.add_request(GenerationRequest(uuid.uuid4().hex, prompt, sampling, uuid.uuid4().hex))  # type: ignore[attr-defined]
    times: list[float] = []
    tokens = 0
    cpu, slept = time.process_time(), sleeps(os.getpid())
    while engine.has_unfinished:  # type: ignore[attr-defined]
        for output in engine.step():  # type: ignore[attr-defined]
            if output.new_token_ids:
                times.append(time.perf_counter())
                tokens += len(output.new_token_ids)
    return Sample(decode_rate(times, tokens), 1000 * (time.process_time() - cpu) / tokens,
                  (sleeps(os.getpid()) - slept) / tokens)


async def run_async(engine: object, prompt: list[int], max_tokens: int) -> Sample:
    from engines.base import GenerationRequest
    from engines.sampling_params import SamplingParams

    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    request = GenerationRequest(uuid.uuid4().hex, prompt, sampling, uuid.uuid4().hex)
    times: list[float] = []
    tokens = 0
    cpu, slept = time.process_time(), sleeps(os.getpid())
    async for output in engine.generate(request):  # type: ignore[attr-defined]
        if output.new_token_ids:
            times.append(time.perf_counter())
            tokens += len(output.new_token_ids)
    return Sample(decode_rate(times, tokens), 1000 * (time.process_time() - cpu) / tokens,
                  (sleeps(os.getpid()) - slept) / tokens)


async def run_http(child: ChildProcess, client: httpx.AsyncClient, prompt: list[int], max_tokens: int) -> Sample:
    from benchmarks.backend.llamacpp import Server  # imports torch: after main() has set OpenMP's spinning

    pid = child.process.pid
    cpu, slept = process_cpu_s(pid), sleeps(pid)
    stream = await Server("edgerun", child, {}, salted=True).complete(client, prompt, max_tokens, uuid.uuid4().hex)
    tokens = stream.num_tokens
    return Sample(stream.decode_tok_s, 1000 * (process_cpu_s(pid) - cpu) / tokens, (sleeps(pid) - slept) / tokens)


def start_backend(args: argparse.Namespace, checkout: Path | None) -> ChildProcess:
    """`edgerun backend` from this checkout, or from `checkout` (a baseline: another worktree)."""
    options = ["--model", args.model, "--log-level", "warning", *args.engine_arg]
    extra = {} if checkout is None else {"cwd": checkout, "env": {"PYTHONPATH": str(checkout)}}
    return ChildProcess.spawn("edgerun", "backend", options, keep_edgerun_env=True, threads=args.threads, **extra)


async def main(args: argparse.Namespace) -> int:
    from engines.omp import may_bound_omp_spinning

    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    may_bound_omp_spinning()  # as the backend does: both sides spin alike
    import torch

    torch.set_num_threads(args.threads)
    from backends.settings import BackendSettings
    from engines.builtin.engine.async_engine import AsyncEngine
    from engines.builtin.engine.llm_engine import LLMEngine
    from engines.builtin.runner.model_runner import ModelRunner

    children = {"http": start_backend(args, None)}
    if args.baseline is not None:
        children["http (baseline)"] = start_backend(args, args.baseline)
    try:
        config = BackendSettings(**{"engine": {"model": args.model, **dict(_pairs(args.engine_arg))}}).engine
        runner = ModelRunner(config)
        rng = random.Random(0)
        prompt = [rng.randrange(1000, 30000) for _ in range(args.prompt_tokens)]
        engine = LLMEngine(config, runner)
        async_engine = AsyncEngine(config, runner)
        for child in children.values():
            child.wait_ready("/health", timeout_s=600)
        samples: dict[str, list[Sample]] = {"engine": [], "async": [], **{name: [] for name in children}}
        load_start = os.getloadavg()
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
            for child in children.values():
                await run_http(child, client, prompt, 8)  # warm-up: first forward, connection
            run_engine(engine, prompt, 8)
            for _ in range(args.rounds):
                samples["engine"].append(run_engine(engine, prompt, args.max_tokens))
                await async_engine.start()
                samples["async"].append(await run_async(async_engine, prompt, args.max_tokens))
                await async_engine.stop()
                for name, child in children.items():
                    samples[name].append(await run_http(child, client, prompt, args.max_tokens))
                if args.verbose:
                    print({k: v[-1] for k, v in samples.items()}, file=sys.stderr)
        report(args, samples, config, load_start, weights_of(runner))
    finally:
        for child in children.values():
            child.stop(timeout_s=30)
    return 0


def _pairs(argv: list[str]) -> list[tuple[str, str]]:
    # `--mode deterministic` -> ("mode", "deterministic"): the engine options both sides share
    keys = {"--mode": "mode", "--weight-dtype": "weight_dtype", "--dtype": "dtype"}
    out = []
    for flag, value in zip(argv[::2], argv[1::2]):
        if flag not in keys:
            raise SystemExit(f"--engine-arg {flag}: only {', '.join(keys)} are passed to both sides")
        out.append((keys[flag], value))
    return out


def weights_of(runner: object) -> str:
    """The CPU's vector level and how the linear weights are held (the fast mode's int4 needs AVX-512)."""
    import torch

    layer, head = runner.weights.layers[0], runner.weights.lm_head  # type: ignore[attr-defined]
    return (f"CPU capability {torch.backends.cpu.get_cpu_capability()}; layer weights "
            f"{type(layer.qkv).__name__}, head {type(head).__name__}")


def report(args: argparse.Namespace, samples: dict[str, list[Sample]], config: object, load_start: tuple[float, ...],
           weights: str) -> None:
    med = statistics.median
    print(f"Command: `python -m benchmarks.backend.serving_path {shlex.join(sys.argv[1:])}`")
    print(f"Machine: {machine(with_torch=True)}; {args.threads} torch threads; load average "
          f"{load_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print(f"Engine: {config}\n{weights}")
    print(f"{args.prompt_tokens}-token prompt, {args.max_tokens} greedy tokens, median of {args.rounds} interleaved rounds\n")
    print("| depth | decode tok/s | / engine | CPU ms per token | sleeps per token | per round tok/s |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    base = med(s.decode_tok_s for s in samples["engine"])
    for name, runs in samples.items():
        rate = med(s.decode_tok_s for s in runs)
        rounds = " ".join(f"{s.decode_tok_s:.1f}" for s in runs)
        print(f"| {name} | {rate:.1f} | {rate / base:.2f}x | {med(s.cpu_ms_per_token for s in runs):.1f} | "
              f"{med(s.sleeps_per_token for s in runs):.0f} | {rounds} |")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.backend.serving_path", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, here and in the child")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                        help="`--mode X` / `--weight-dtype X` for both sides (repeatable)")
    parser.add_argument("--baseline", type=Path, metavar="CHECKOUT",
                        help="also serve from this checkout (e.g. a worktree of main), interleaved: before/after")
    parser.add_argument("--verbose", action="store_true")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args(sys.argv[1:]))))
