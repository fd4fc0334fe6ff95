"""Disaggregated prefill/decode against two mixed backends, under the same mixed workload.

    python -m benchmarks.disagg.serving [--duration 40] [--rounds 2] [--streams 4] [--long-rate 0.12 | --prefill-load 0.5]

Two real backends (SmolLM2-135M, the built-in engine, one torch thread each), each pinned to its
own core (sched_setaffinity, as `taskset -c`), and two gateways in front of the same two
processes: one lists them as `mixed` backends (the baseline: each prefills and decodes), the
other as one `prefill` and one `decode` backend (the subject: long prompts are prefilled on the
first, their KV pulled by the second, which decodes everything; prompts it can prefill in at most
`--local-prefill` tokens it prefills itself). The backends run `--role mixed`, so one pair
serves both configurations, and the phases alternate (benchmarks/common.py).

The workload, the same in both: `--streams` steady clients, each streaming short-prompt answers
of `--stream-tokens` tokens back to back, plus long prompts (1,000-2,000 tokens, unique, so no
prefix hits) arriving on a Poisson clock of `--long-rate` per second, each answered with 16
tokens. `--prefill-load U` picks the rate instead: it times three long prompts alone on the
prefill backend first and sets the rate so that backend is busy a fraction U of the time (the
shared machine's load decides how fast a core prefills, so a fixed rate may saturate it).
Reported: inter-token latency of the steady streams (gaps between SSE chunks at the
client) p50/p90/p99 and the longest gap, TTFT p50/p90 of the long prompts and of the streams,
tokens/s, and the KV transfer time and bandwidth per 1,000 tokens (from the decode backend's
/metrics).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.common import interleave, machine
from cli.processes import ChildProcess

MODEL_ID = "@cf/huggingface/smollm2-135m-instruct"
ADMIN_TOKEN = "bench-admin-token-" + "0" * 32  # the gateway wants at least 32 characters
LONG_MAX_TOKENS = 16
KV_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4  # SmolLM2: layers x (k, v) x kv heads x head dim x float32


@dataclass
class Phase:
    name: str
    itl_s: list[float] = field(default_factory=list)  # gaps between a steady stream's chunks
    stream_ttft_s: list[float] = field(default_factory=list)
    long_ttft_s: list[float] = field(default_factory=list)
    num_tokens: int = 0  # chunks received (about one token each)
    seconds: float = 0.0
    errors: int = 0
    kv_pull_s: float = 0.0
    kv_pull_bytes: float = 0.0
    kv_pulls: float = 0.0
    rounds: list[str] = field(default_factory=list)  # each round's own ITL p50/p90/p99 and long prompts, to show the noise

    def __add__(self, other: Phase) -> Phase:
        return Phase(
            self.name, self.itl_s + other.itl_s, self.stream_ttft_s + other.stream_ttft_s,
            self.long_ttft_s + other.long_ttft_s, self.num_tokens + other.num_tokens, self.seconds + other.seconds,
            self.errors + other.errors, self.kv_pull_s + other.kv_pull_s, self.kv_pull_bytes + other.kv_pull_bytes,
            self.kv_pulls + other.kv_pulls, self.rounds + other.rounds,
        )


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_backend(name: str, core: int, num_kv_blocks: int, extra_env: dict[str, str] | None = None) -> ChildProcess:
    env = {"EDGERUN_LOG_JSON": "false", "EDGERUN_ENGINE__NUM_THREADS": "1", "EDGERUN_ENGINE__NUM_KV_BLOCKS": str(num_kv_blocks),
           **(extra_env or {})}
    backend = ChildProcess.spawn(name, "backend", ["--model", "smollm2", "--log-level", "warning"], env=env, threads=1)
    os.sched_setaffinity(backend.process.pid, {core})  # `taskset -c <core>`: torch's threads start after this
    return backend


def start_gateway(name: str, backends: list[dict[str, str]], workdir: Path, local_prefill: int) -> ChildProcess:
    env = {
        "EDGERUN_SQLITE_PATH": str(workdir / f"{name}.sqlite3"),
        "EDGERUN_ADMIN_TOKEN": ADMIN_TOKEN,
        "EDGERUN_TOKENIZER_CACHE_DIR": str(workdir / "tokenizers"),
        "EDGERUN_LOG_LEVEL": "warning",
        "EDGERUN_BACKENDS": json.dumps(backends),
        "EDGERUN_DISAGG_MAX_LOCAL_PREFILL_LENGTH": str(local_prefill),
        "EDGERUN_TENANT_MAX_CONCURRENT_REQUESTS": "1000",
        "EDGERUN_BACKEND_FIRST_BYTE_TIMEOUT_S": "300",  # a long prompt queued behind others on one core
        "EDGERUN_BACKEND_READ_TIMEOUT_S": "300",
    }
    gateway = ChildProcess.spawn(name, "serve", env=env)
    gateway.wait_ready("/healthz")
    return gateway


def create_key(base: str, account: str) -> str:
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    created = httpx.post(f"{base}/admin/v1/tenants", json={"name": account, "account_ids": [account]}, headers=admin)
    tenant = created.json()["result"]["id"]
    return httpx.post(f"{base}/admin/v1/tenants/{tenant}/keys", json={}, headers=admin).json()["result"]["secret"]


def long_prompt(rng: random.Random) -> str:
    """1,000-2,000 tokens of unique text (" 42" is three of SmolLM2's tokens)."""
    return " ".join(str(rng.randrange(10, 99)) for _ in range(rng.randrange(333, 667)))


async def stream(client: httpx.AsyncClient, url: str, key: str, body: dict, phase: Phase, *, steady: bool) -> None:
    started = time.perf_counter()
    last: float | None = None
    try:
        async with client.stream("POST", url, json={**body, "stream": True}, headers={"authorization": f"Bearer {key}"}) as r:
            if r.status_code != 200:
                phase.errors += 1
                print(f"{phase.name}: {r.status_code} {(await r.aread())[:300]!r}", file=sys.stderr)
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if not event.get("response"):
                    continue
                now = time.perf_counter()
                if last is None:
                    (phase.stream_ttft_s if steady else phase.long_ttft_s).append(now - started)
                elif steady:
                    phase.itl_s.append(now - last)
                last = now
                phase.num_tokens += 1
    except httpx.HTTPError as exc:
        phase.errors += 1
        print(f"{phase.name}: {type(exc).__name__} {exc}", file=sys.stderr)


async def kv_counters(decode_url: str) -> tuple[float, float, float]:
    """(seconds, bytes, pulls) the decode backend has spent pulling KV, cumulative."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{decode_url}/metrics", timeout=10)).text
    values = {"edgerun_backend_kv_pull_seconds_sum": 0.0, "edgerun_backend_kv_pull_bytes_total": 0.0,
              "edgerun_backend_kv_pull_seconds_count": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in values:
            values[name] += float(line.rsplit(" ", 1)[1])
    return (values["edgerun_backend_kv_pull_seconds_sum"], values["edgerun_backend_kv_pull_bytes_total"],
            values["edgerun_backend_kv_pull_seconds_count"])


async def run_phase(name: str, gateway_url: str, key: str, account: str, decode_url: str, args: argparse.Namespace,
                    seed: int) -> Phase:
    phase = Phase(name)
    url = f"{gateway_url}/client/v4/accounts/{account}/ai/run/{MODEL_ID}"
    rng = random.Random(seed)
    before = await kv_counters(decode_url)
    deadline = time.perf_counter() + args.duration
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0), limits=limits) as client:

        async def steady(i: int) -> None:
            n = 0
            while time.perf_counter() < deadline:
                prompt = f"Stream {i}.{n}: count slowly from one to one hundred, in words."
                body = {"prompt": prompt, "max_tokens": args.stream_tokens, "temperature": 0.0, "raw": True}
                await stream(client, url, key, body, phase, steady=True)
                n += 1

        async def arrivals() -> None:
            tasks = []
            while (now := time.perf_counter()) < deadline:
                await asyncio.sleep(min(rng.expovariate(args.long_rate), max(0.0, deadline - now)))
                if time.perf_counter() >= deadline:
                    break
                body = {"prompt": long_prompt(rng), "max_tokens": LONG_MAX_TOKENS, "temperature": 0.0, "raw": True}
                tasks.append(asyncio.create_task(stream(client, url, key, body, phase, steady=False)))
            await asyncio.gather(*tasks)

        started = time.perf_counter()
        await asyncio.gather(arrivals(), *(steady(i) for i in range(args.streams)))
        phase.seconds = time.perf_counter() - started
    after = await kv_counters(decode_url)
    phase.kv_pull_s, phase.kv_pull_bytes, phase.kv_pulls = (a - b for a, b in zip(after, before, strict=True))
    itl_ms = [f"{1e3 * pct(phase.itl_s, q):.0f}" for q in (0.5, 0.9, 0.99)]
    phase.rounds = [f"{'/'.join(itl_ms)} ms, {len(phase.long_ttft_s)} long, {stalled_share(phase.itl_s):.0%} stalled"]
    return phase


async def prefill_seconds(url: str, repeats: int = 3) -> float:
    """Median seconds one backend takes to prefill a long prompt (1,500 tokens on average) alone."""
    rng = random.Random(5)
    times = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        for _ in range(repeats):
            prompt = " ".join(str(rng.randrange(10, 99)) for _ in range(500))
            started = time.perf_counter()
            response = await client.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 1})
            response.raise_for_status()
            times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def stalled_share(itl_s: list[float], threshold_s: float = 1.0) -> float:
    """The share of the streams' time spent in gaps longer than `threshold_s` (frozen output)."""
    total = sum(itl_s)
    return sum(g for g in itl_s if g > threshold_s) / total if total else float("nan")


def report(baseline: Phase, subject: Phase, args: argparse.Namespace, command: str) -> str:
    def row(label: str, fmt: str, b: float, s: float, better_lower: bool = True) -> str:
        ratio = (b / s if better_lower else s / b) if b and s else float("nan")
        return f"| {label} | {fmt.format(b)} | {fmt.format(s)} | {ratio:.2f}x |"

    lines = [
        f"`{command}`", "",
        f"Machine: {machine(with_torch=True)}. Each backend pinned to one core, one torch thread; gateways and",
        f"client unpinned. {args.rounds} interleaved rounds of {args.duration:g} s per configuration; long prompts at "
        f"{args.long_rate:.3f}/s. Both configurations run the engine's defaults: chunked prefill of at most 512 tokens "
        "per step (decodes first), max_num_seqs 32.", "",
        "| metric | 2 x mixed | prefill + decode | ratio (higher: disaggregated better) |", "|---|---|---|---|",
    ]
    ms = "{:.0f} ms"
    for q in (0.5, 0.9, 0.99):
        lines.append(row(f"ITL p{int(q * 100)} (steady streams)", ms, 1e3 * pct(baseline.itl_s, q), 1e3 * pct(subject.itl_s, q)))
    lines.append(row("longest gap", ms, 1e3 * max(baseline.itl_s, default=0), 1e3 * max(subject.itl_s, default=0)))
    lines.append(row("time in gaps > 1 s (share of streaming time)", "{:.1%}", stalled_share(baseline.itl_s),
                     stalled_share(subject.itl_s)))
    for q in (0.5, 0.9):
        lines.append(row(f"TTFT p{int(q * 100)} long prompts", ms, 1e3 * pct(baseline.long_ttft_s, q), 1e3 * pct(subject.long_ttft_s, q)))
    for q in (0.5, 0.9):
        b, s = 1e3 * pct(baseline.stream_ttft_s, q), 1e3 * pct(subject.stream_ttft_s, q)
        lines.append(row(f"TTFT p{int(q * 100)} steady streams", ms, b, s))
    lines.append(row("tokens/s (all streams)", "{:.1f}", baseline.num_tokens / baseline.seconds,
                     subject.num_tokens / subject.seconds, better_lower=False))
    lines.append(f"| long prompts answered | {len(baseline.long_ttft_s)} | {len(subject.long_ttft_s)} | |")
    lines.append(f"| ITL samples | {len(baseline.itl_s)} | {len(subject.itl_s)} | |")
    lines.append(f"| errors | {baseline.errors} | {subject.errors} | |")
    for i, (b, s) in enumerate(zip(baseline.rounds, subject.rounds, strict=True)):
        lines.append(f"| round {i + 1}: ITL p50/p90/p99, long prompts, time in gaps > 1 s | {b} | {s} | |")
    if subject.kv_pulls:
        k_tokens = subject.kv_pull_bytes / KV_BYTES_PER_TOKEN / 1000
        lines += ["", f"KV transfer ({args.kv_transport}, decode backend's /metrics): {subject.kv_pulls:.0f} pulls, "
                      f"{subject.kv_pull_bytes / 1e6:.0f} MB, {1e3 * subject.kv_pull_s / k_tokens:.1f} ms per 1,000 tokens "
                      f"({KV_BYTES_PER_TOKEN * 1000 / 1e6:.1f} MB), {subject.kv_pull_bytes / subject.kv_pull_s / 1e9:.2f} GB/s."]
    return "\n".join(lines)


async def transfer_only(transport: str, num_tokens: int = 1000, repeats: int = 20) -> tuple[float, float]:
    """The transport alone, between two SmolLM2-shaped caches in this process with nothing else running:
    (median ms per `num_tokens` tokens, GB/s). Each pull takes a fresh pin of the same blocks."""
    import torch

    from backends.kv_transfer.channel import build_channel
    from backends.kv_transfer.exports import KVExports
    from backends.kv_transfer.layout import KVLayout
    from backends.kv_transfer.opaque import OpaqueState
    from backends.kv_transfer.tcp import TcpExporter
    from engines.base import KVPin
    from engines.builtin.runner.attention import allocate_kv_caches

    num_blocks = -(-num_tokens // 16)
    src = KVLayout.of(allocate_kv_caches(30, 256, 16, 3, 64, torch.float32, torch.device("cpu")), "smollm2")
    dst = KVLayout.of(allocate_kv_caches(30, 256, 16, 3, 64, torch.float32, torch.device("cpu")), "smollm2")
    for cache in src.caches:
        cache.normal_()

    async def no_release(pin_id: int) -> None:
        return None

    exports = KVExports(60.0, no_release)
    exporter = TcpExporter(src, exports, b"bench-secret", "127.0.0.1")
    await exporter.start()
    source_channel = build_channel(transport, src, b"bench-secret", "127.0.0.1")
    channel = build_channel(transport, dst, b"bench-secret", "127.0.0.1")
    block_ids = list(range(10, 10 + num_blocks))
    times = []
    try:
        for pin_id in range(repeats):
            pin = KVPin(pin_id, block_ids, num_tokens)
            source = OpaqueState(transport, "127.0.0.1", exporter.port, pin_id, num_tokens, num_blocks, src.fingerprint,
                                 source_channel.opaque_extra(block_ids))
            exports.add(pin)
            started = time.perf_counter()
            nbytes = await channel.pull(source, 0, list(range(100, 100 + num_blocks)))
            times.append(time.perf_counter() - started)
    finally:
        await exporter.stop()
    assert all(torch.equal(a[10 : 10 + num_blocks], b[100 : 100 + num_blocks]) for a, b in zip(src.caches, dst.caches))
    median = sorted(times)[len(times) // 2]
    return 1e3 * median, nbytes / median / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.disagg.serving", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=40.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, default=4, help="steady streaming clients")
    parser.add_argument("--stream-tokens", type=int, default=64)
    parser.add_argument("--long-rate", type=float, default=0.12, help="long prompts per second (Poisson)")
    parser.add_argument("--prefill-load", type=float, default=None,
                        help="instead of --long-rate: the share of time the prefill backend should spend prefilling")
    parser.add_argument("--local-prefill", type=int, default=256, help="the subject's max_local_prefill_length")
    parser.add_argument("--cores", default="0,1", help="the two cores to pin the backends to")
    parser.add_argument("--num-kv-blocks", type=int, default=2048)
    parser.add_argument("--kv-transport", choices=["tcp", "mooncake"], default="tcp", help="the backends' KV transport")
    parser.add_argument("--transfer-only", action="store_true", help="only time the KV transports, in this process")
    args = parser.parse_args(argv)
    transports = ["tcp"] + (["mooncake"] if importlib.util.find_spec("mooncake") is not None else [])
    transfer = {t: asyncio.run(transfer_only(t)) for t in transports}
    transfer_lines = [f"KV transport alone (two SmolLM2-shaped caches in one process, 1,000 tokens = "
                      f"{KV_BYTES_PER_TOKEN * 1000 / 1e6:.1f} MB, median of 20):"]
    transfer_lines += [f"- {t}: {ms:.1f} ms per 1,000 tokens, {gbps:.2f} GB/s" for t, (ms, gbps) in transfer.items()]
    if args.transfer_only:
        print("\n".join(transfer_lines))
        return 0
    cores = [int(c) for c in args.cores.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="edgerun-bench-disagg-"))
    processes: list[ChildProcess] = []
    try:
        kv_env = {"EDGERUN_KV_TRANSPORT": args.kv_transport}
        if args.kv_transport == "mooncake":  # unauthenticated (SECURITY.md): accepted on this VM for the run
            kv_env["EDGERUN_KV_MOONCAKE_TRUSTED_NETWORK"] = "true"
        first, second = (start_backend(name, core, args.num_kv_blocks, kv_env)
                         for name, core in zip(("bk-a", "bk-b"), cores, strict=True))
        processes += [first, second]
        for backend in processes:
            backend.wait_ready("/health", 300)
        spec = {"models": [MODEL_ID], "region": "local"}
        mixed = start_gateway("gw-mixed", [
            {**spec, "id": "a", "base_url": first.url, "role": "mixed"},
            {**spec, "id": "b", "base_url": second.url, "role": "mixed"}], workdir, args.local_prefill)
        processes.append(mixed)
        disagg = start_gateway("gw-disagg", [
            {**spec, "id": "a", "base_url": first.url, "role": "prefill"},
            {**spec, "id": "b", "base_url": second.url, "role": "decode"}], workdir, args.local_prefill)
        processes.append(disagg)
        mixed_key, disagg_key = create_key(mixed.url, "bench-m"), create_key(disagg.url, "bench-d")

        async def run_all() -> tuple[Phase, Phase]:
            warm = argparse.Namespace(**{**vars(args), "duration": 8.0})
            await run_phase("warm-up", mixed.url, mixed_key, "bench-m", second.url, warm, 1)
            await run_phase("warm-up", disagg.url, disagg_key, "bench-d", second.url, warm, 2)
            if args.prefill_load is not None:
                seconds = await prefill_seconds(first.url)
                args.long_rate = args.prefill_load / seconds
                print(f"a long prompt takes {seconds:.1f} s to prefill alone: --long-rate {args.long_rate:.3f}",
                      file=sys.stderr)
            mixed_seeds, disagg_seeds = iter(range(100, 200)), iter(range(100, 200))  # the same arrivals per round
            paired = await interleave(
                lambda: run_phase("mixed", mixed.url, mixed_key, "bench-m", second.url, args, next(mixed_seeds)),
                lambda: run_phase("disagg", disagg.url, disagg_key, "bench-d", second.url, args, next(disagg_seeds)),
                args.rounds,
            )
            total_b, total_s = paired.baseline[0], paired.subject[0]
            for b, s in zip(paired.baseline[1:], paired.subject[1:], strict=True):
                total_b, total_s = total_b + b, total_s + s
            return total_b, total_s

        baseline, subject = asyncio.run(run_all())
    finally:
        for process in reversed(processes):
            process.stop(timeout_s=15)
    command = "python -m benchmarks.disagg.serving " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    print(report(baseline, subject, args, command.strip()))
    print("\n" + "\n".join(transfer_lines))
    return 0 if baseline.errors + subject.errors == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
