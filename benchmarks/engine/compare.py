"""Benchmark the built-in engine against Hugging Face transformers (and llama.cpp if installed).

    python -m benchmarks.engine.compare [--repeats 3] [--out results.json] [--profile] [--set FIELD=VALUE]
                                        [--no-kernels-off]

Same GGUF weights (SmolLM2-135M-Instruct), greedy decoding, on the CPU. Measures: batch-1 decode
tokens/s; aggregate tokens/s of 16 concurrent 128-token streams (ours through AsyncEngine,
transformers with one left-padded batch); TTFT of a 1,000-token prompt whose first 900 tokens
are cached vs cold; cold start (a fresh process to its first token, weights cached). Each number
is the median of `--repeats` runs, because a shared machine is noisy.

The streams also run, in every round right after ours, in a child process with EDGERUN_KERNELS=off
(the same engine on torch's own ops, as on a machine where edgerun's kernels do not build): the
table shows both and their ratio, with each process's CPU ms per token (steadier than wall time on a
busy machine), so a cost of the kernels at many streams cannot come back unseen (issue 35).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

from benchmarks.engine.baselines import HFBaseline, LlamaCppBaseline, llama_cpp_available
from benchmarks.engine.report import machine_info, percentile, render
from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.builtin.engine.async_engine import AsyncEngine
from engines.builtin.engine.llm_engine import LLMEngine
from engines.builtin.loader import smollm2_gguf_path
from engines.builtin.runner.model_runner import ModelRunner
from engines.sampling_params import SamplingParams

TOPICS = [
    "rain", "chess", "bread", "volcanoes", "jazz", "bees", "trains", "glass",
    "owls", "tea", "maps", "snow", "copper", "lighthouses", "origami", "comets",
]


def engine_options(options: list[str]) -> dict[str, object]:
    """["decode_dtype=float16", "max_num_seqs=16"] -> EngineConfig keyword arguments."""
    parsed: dict[str, object] = {}
    for option in options:
        key, sep, raw = option.partition("=")
        if not sep:
            raise SystemExit(f"--set {option!r}: write FIELD=VALUE")
        value: object = None if raw.lower() == "none" else raw
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                pass
        parsed[key] = value
    return parsed


def decode_rate(times: list[float]) -> float:
    """Tokens/s after the first token: (n - 1) tokens over the time from first to last."""
    return (len(times) - 1) / (times[-1] - times[0])


def gaps_ms(runs: list[list[float]]) -> list[float]:
    return [(b - a) * 1000 for times in runs for a, b in zip(times, times[1:])]


def greedy(request_id: str, prompt: list[int], max_tokens: int, salt: str | None = None) -> GenerationRequest:
    return GenerationRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), salt)


def long_prompt(encode: Callable[[str], list[int]], num_tokens: int, seed: str) -> list[int]:
    text = " ".join(f"{seed} note {i}: the {TOPICS[i % len(TOPICS)]} report lists item {i * 7 % 101}." for i in range(400))
    tokens = encode(text)
    assert len(tokens) >= num_tokens, "filler text too short"
    return tokens[:num_tokens]


class Ours:
    """Our engine driven directly (LLMEngine) for one request, or through AsyncEngine for many."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.runner = ModelRunner(config)
        self.engine = LLMEngine(config, self.runner)
        self.num_requests = 0
        self.streams_cpu_s = 0.0

    def chat(self, text: str) -> list[int]:
        tok = self.runner.tokenizer
        return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))

    def generate_one(self, prompt: list[int], max_tokens: int, salt: str | None = None) -> tuple[float, list[float], int]:
        """(start, arrival time of each token, cached prompt tokens)."""
        self.num_requests += 1
        started = time.perf_counter()
        self.engine.add_request(greedy(f"b{self.num_requests}", prompt, max_tokens, salt))
        times, cached = [], 0
        while self.engine.has_unfinished:
            for output in self.engine.step():
                times += [time.perf_counter()] * len(output.new_token_ids)
                cached = output.num_cached_tokens
        return started, times, cached

    def streams(self, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[float], list[float]]:
        """All prompts at once through AsyncEngine: (wall s, TTFTs s, inter-token gaps s); `streams_cpu_s` gets
        this process's CPU seconds for them."""

        async def main() -> tuple[float, list[float], list[float]]:
            engine = AsyncEngine(self.config, self.runner)
            await engine.start()
            ttfts: list[float] = []
            gaps: list[float] = []

            async def one(i: int, prompt: list[int]) -> None:
                start = last = time.perf_counter()
                async for output in engine.generate(greedy(f"s{i}", prompt, max_tokens)):
                    now = time.perf_counter()
                    if output.num_generated_tokens == len(output.new_token_ids):  # the first token
                        ttfts.append(now - start)
                    else:
                        gaps.append(now - last)
                    last = now

            try:
                started, cpu_started = time.perf_counter(), time.process_time()
                await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
                self.streams_cpu_s = time.process_time() - cpu_started
                return time.perf_counter() - started, ttfts, gaps
            finally:
                await engine.stop()

        return asyncio.run(main())


def stream_prompts(ours: Ours, count: int) -> list[list[int]]:
    return [ours.chat(f"Tell me everything you know about {topic}.") for topic in TOPICS[:count]]


class KernelsOffStreams:
    """The streams measurement in a child process whose engine runs without edgerun's kernels (EDGERUN_KERNELS=off);
    `round()` runs one there (this process waits meanwhile) -> (wall s, CPU s of the child)."""

    def __init__(self, args: argparse.Namespace) -> None:
        command = [sys.executable, "-m", "benchmarks.engine.compare", "--streams-child", "--streams", str(args.streams),
                   "--tokens", str(args.tokens), "--num-kv-blocks", str(args.num_kv_blocks)]
        for option in args.set:
            command += ["--set", option]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env={**os.environ, "EDGERUN_KERNELS": "off"}, cwd=Path(__file__).resolve().parents[2])
        self.reply()  # loaded and warmed up

    def reply(self) -> dict:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the kernels-off child exited ({self.process.wait()})")
        result: dict = json.loads(line)
        return result

    def round(self) -> tuple[float, float]:
        assert self.process.stdin is not None
        self.process.stdin.write("round\n")
        self.process.stdin.flush()
        result = self.reply()
        return result["wall_s"], result["cpu_s"]

    def __enter__(self) -> KernelsOffStreams:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


def streams_child(args: argparse.Namespace) -> None:
    """--streams-child: load the engine, say so, then one streams measurement per "round" line on stdin."""
    ours = Ours(EngineConfig(num_kv_blocks=args.num_kv_blocks, **engine_options(args.set)))
    prompts = stream_prompts(ours, args.streams)
    ours.streams(prompts, 8)  # warm-up
    print(json.dumps({"linear_format": ours.config.linear_format}), flush=True)
    for _ in sys.stdin:
        wall, _, _ = ours.streams(prompts, args.tokens)
        print(json.dumps({"wall_s": wall, "cpu_s": ours.streams_cpu_s}), flush=True)


def measure(args: argparse.Namespace, ours: Ours, hf: HFBaseline | None) -> dict:
    """Every measurement, ours and the baselines' in turn within each round, so that all see
    the same machine load; medians over `args.repeats` rounds."""
    chat = ours.chat("Write a long story about a lighthouse keeper and a storm.")
    streams = stream_prompts(ours, args.streams)
    ours.generate_one(chat, 8)  # warm-ups
    if hf is not None:
        hf.generate_one(chat, 8)
    s: dict[str, list] = {k: [] for k in ("b1", "hf_b1", "streams", "cpu", "off", "hf_wall", "cold", "cached",
                                              "num_cached", "hf_cold")}
    with KernelsOffStreams(args) if args.kernels_off else nullcontext() as off:
        for rep in range(args.repeats):
            print(f"round {rep + 1}/{args.repeats}: batch-1 decode, {args.streams} streams, TTFT", file=sys.stderr)
            s["b1"].append(ours.generate_one(chat, args.tokens)[1])
            s["streams"].append(ours.streams(streams, args.tokens))
            s["cpu"].append(ours.streams_cpu_s)
            if off is not None:
                s["off"].append(off.round())
            ttft_and_baseline(args, ours, hf, chat, streams, rep, s)
    return summarise(args, ours, hf, chat, s)


def ttft_and_baseline(args: argparse.Namespace, ours: Ours, hf: HFBaseline | None, chat: list[int], streams: list[list[int]],
                  rep: int, s: dict[str, list]) -> None:
    """The round's TTFT measurements, then the transformers baseline's."""
    encode = ours.runner.tokenizer.encode
    long = long_prompt(encode, 1000, seed=f"run{rep}")
    start, times, _ = ours.generate_one(long, 1, salt=f"cold{rep}")
    s["cold"].append(times[0] - start)
    # An earlier request of the same tenant shared the first 900 tokens, then went elsewhere.
    ours.generate_one(long[:900] + long_prompt(encode, 100, seed=f"other{rep}"), 1, salt=f"warm{rep}")
    start, times, num_cached = ours.generate_one(long, 1, salt=f"warm{rep}")
    s["cached"].append(times[0] - start)
    s["num_cached"].append(num_cached)
    if hf is not None:
        s["hf_b1"].append(hf.generate_one(chat, args.tokens)[1])
        s["hf_wall"].append(hf.generate_batch(streams, args.tokens))
        start, times = hf.generate_one(long, 1)
        s["hf_cold"].append(times[0] - start)


def summarise(args: argparse.Namespace, ours: Ours, hf: HFBaseline | None, chat: list[int], s: dict[str, list]) -> dict:
    num_tokens = args.streams * args.tokens
    wall = statistics.median(r[0] for r in s["streams"])
    ttfts = [x * 1000 for r in s["streams"] for x in r[1]]
    gaps = [x * 1000 for r in s["streams"] for x in r[2]]
    results = {
        "ours": {
            "b1_decode_tok_s": statistics.median(decode_rate(t) for t in s["b1"]),
            "b1_itl_ms_p50": percentile(gaps_ms(s["b1"]), 50), "b1_itl_ms_p90": percentile(gaps_ms(s["b1"]), 90),
            "streams_agg_tok_s": args.streams * args.tokens / wall, "streams_wall_s": wall,
            "streams_ttft_ms_p50": percentile(ttfts, 50), "streams_ttft_ms_p90": percentile(ttfts, 90),
            "streams_itl_ms_p50": percentile(gaps, 50), "streams_itl_ms_p90": percentile(gaps, 90),
            "streams_cpu_ms_per_token": 1000 * statistics.median(s["cpu"]) / num_tokens,
            "ttft_prompt_tokens": 1000, "ttft_cached_tokens": s["num_cached"][-1],
            "ttft_cold_s": statistics.median(s["cold"]), "ttft_cached_s": statistics.median(s["cached"]),
        },
        "transformers": {},
        "kernels_off": {},
    }
    if s["off"]:
        results["kernels_off"] = {
            "streams_agg_tok_s": num_tokens / statistics.median(wall for wall, _ in s["off"]),
            "streams_cpu_ms_per_token": 1000 * statistics.median(cpu for _, cpu in s["off"]) / num_tokens,
            "rounds_tok_s": [round(num_tokens / wall, 1) for wall, _ in s["off"]],
        }
        results["ours"]["streams_rounds_tok_s"] = [round(num_tokens / r[0], 1) for r in s["streams"]]
    if hf is not None:
        hf_wall = statistics.median(s["hf_wall"])
        results["transformers"] = {
            "b1_decode_tok_s": statistics.median(decode_rate(t) for t in s["hf_b1"]),
            "b1_itl_ms_p50": percentile(gaps_ms(s["hf_b1"]), 50), "b1_itl_ms_p90": percentile(gaps_ms(s["hf_b1"]), 90),
            "streams_agg_tok_s": args.streams * args.tokens / hf_wall, "streams_wall_s": hf_wall,
            "ttft_cold_s": statistics.median(s["hf_cold"]), "load_s": hf.load_s,
        }
    results["profile"] = profile_decode(ours, chat) if args.profile else ""
    results["chat_prompt"] = chat
    return results


def profile_decode(ours: Ours, prompt: list[int]) -> str:
    profiler = cProfile.Profile()
    profiler.runcall(ours.generate_one, prompt, 32)
    buffer = io.StringIO()
    pstats.Stats(profiler, stream=buffer).sort_stats("tottime").print_stats(15)
    return buffer.getvalue()


def measure_llama_cpp(args: argparse.Namespace, prompt: list[int]) -> dict:
    if not llama_cpp_available():
        return {"skipped": "llama-cpp-python is not installed (it builds llama.cpp from source; not a dependency)"}
    llm = LlamaCppBaseline(smollm2_gguf_path())
    runs = [llm.generate_one(prompt, args.tokens)[1] for _ in range(args.repeats)]
    return {"b1_decode_tok_s": statistics.median(decode_rate(t) for t in runs)}


def measure_cold_start(args: argparse.Namespace) -> tuple[float, dict[str, float]]:
    """Median wall time from spawning a fresh interpreter to its first generated token."""
    walls, splits = [], {}
    command = [sys.executable, "-m", "benchmarks.engine.compare", "--first-token-child"]
    for option in args.set:
        command += ["--set", option]
    for _ in range(args.repeats):
        started = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2])
        walls.append(time.perf_counter() - started)
        splits = json.loads(proc.stdout.strip().splitlines()[-1])
        splits = {"interpreter_and_imports": walls[-1] - sum(splits.values()), **splits}
    return statistics.median(walls), splits


def first_token_child(options: list[str]) -> None:
    t0 = time.perf_counter()
    engine = LLMEngine(EngineConfig(**engine_options(options)))  # otherwise what `edgerun` starts with
    t_loaded = time.perf_counter()
    tok = engine.tokenizer
    engine.add_request(greedy("cold", tok.encode(tok.apply_chat_template([{"role": "user", "content": "Hello!"}])), 1))
    while engine.has_unfinished:
        engine.step()
    print(json.dumps({"load": t_loaded - t0, "first_token": time.perf_counter() - t_loaded}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.engine.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128, help="tokens per generation")
    parser.add_argument("--streams", type=int, default=16, help=f"concurrent streams (at most {len(TOPICS)})")
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    parser.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE",
        help="an EngineConfig field for our engine, e.g. max_num_batched_tokens=256 (repeatable)",
    )
    parser.add_argument("--skip-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--profile", action="store_true", help="append a cProfile of a batch-1 generation")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    parser.add_argument("--no-kernels-off", dest="kernels_off", action="store_false",
                        help="skip the streams in a child without edgerun's kernels (EDGERUN_KERNELS=off)")
    parser.add_argument("--first-token-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--streams-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.first_token_child:
        first_token_child(args.set)
        return
    if args.streams_child:
        streams_child(args)
        return
    results: dict = {"machine": machine_info(), "params": {k: v for k, v in vars(args).items() if k != "out"}}
    ours = Ours(EngineConfig(num_kv_blocks=args.num_kv_blocks, **engine_options(args.set)))
    config = ours.config
    results["params"]["weights"] = f"mode {config.mode}, {config.dtype} activations, {config.linear_format or config.dtype} linear weights"
    hf = None
    if not args.skip_hf:
        print("transformers: loading the GGUF...", file=sys.stderr)
        hf = HFBaseline(smollm2_gguf_path())
    results |= measure(args, ours, hf)
    del ours, hf
    save(results, args.out)  # partial results survive a later stage that fails
    print("cold start in fresh processes...", file=sys.stderr)
    results["ours"]["cold_start_s"], results["ours"]["cold_start_splits_s"] = measure_cold_start(args)
    results["llama_cpp"] = measure_llama_cpp(args, results.pop("chat_prompt"))
    results["machine"]["load_average_at_end"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    save(results, args.out)
    print(render(results))


def save(results: dict, path: Path | None) -> None:
    if path is not None:
        path.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
