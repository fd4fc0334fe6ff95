"""How much the gateway adds: throughput and latency through it vs calling the backend directly.

    python -m gateway.bench_overhead [--concurrency 50] [--duration 10] [--chunks 8] [--rate R]

Starts, as separate processes on loopback, a minimal stub backend that answers at once (a tiny
Starlette app speaking the streaming /v1/completions protocol - used only by this benchmark) and
`edgerun serve` in front of it (embedded store, one tenant and key made through the admin API).
Then `concurrency` closed-loop clients (a lean raw HTTP/1.1 client, keep-alive) stream
completions, straight to the stub and through the gateway's Workers AI route, alternating in
rounds. The table compares requests/s and latency percentiles (request sent -> last byte) and
shows the gateway's CPU time per request; "added" is gateway minus direct at the same
percentile. The stub's tokenizer is a small byte-level BPE trained at start-up, with a ChatML
template, so the gateway does its real per-request work (template, tokenize, hash, route,
meter, re-encode the stream).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODEL_ID = "@cf/edgerun/bench-stub"
ROUNDS = 4
PROMPT = "Summarise the design of an inference gateway in front of regional GPU backends, in one line."


# ---- the stub backend (its own process) -------------------------------------------------------


def stub_tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|im_start|>", "<|im_end|>"], show_progress=False)
    corpus = [PROMPT, CHATML, *(f"the gateway routes request {i} to backend {i % 7}" for i in range(500))]
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer.to_str()


def stub_app(num_chunks: int) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    payload = {
        "model": "stub",
        "tokenizer_json": stub_tokenizer_json(),
        "chat_template": CHATML,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "max_model_len": 8192,
    }

    def event(obj: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    async def completions(request: Request) -> StreamingResponse:
        body = await request.json()
        prompt = body["prompt"]
        num_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())

        async def stream() -> Any:
            for i in range(num_chunks):
                finish = "length" if i == num_chunks - 1 else None
                yield event(
                    {
                        "id": "x",
                        "object": "text_completion",
                        "choices": [{"index": 0, "text": " tok", "finish_reason": finish}],
                    }
                )
            usage = {
                "prompt_tokens": num_prompt,
                "completion_tokens": num_chunks,
                "total_tokens": num_prompt + num_chunks,
                "prompt_tokens_details": {"cached_tokens": 0},
            }
            yield event({"id": "x", "object": "text_completion", "choices": [], "usage": usage})
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def load(request: Request) -> JSONResponse:
        return JSONResponse({"running": 0, "waiting": 0, "prefill_tokens": 0, "decode_tokens": 0})

    async def kv_events(request: Request) -> JSONResponse:
        return JSONResponse([])

    async def tokenizer(request: Request) -> JSONResponse:
        return JSONResponse(payload)

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/health", health),
            Route("/load", load),
            Route("/kv_cache_events", kv_events, methods=["POST"]),
            Route("/edgerun/v1/tokenizer", tokenizer),
        ]
    )


def serve_stub(port: int, num_chunks: int) -> None:
    import uvicorn

    uvicorn.run(stub_app(num_chunks), host="127.0.0.1", port=port, log_level="warning", access_log=False)


# ---- load generation: a lean raw HTTP/1.1 client, so the load generator steals little CPU ------


class RawConnection:
    """One keep-alive HTTP/1.1 connection; reads chunked or sized bodies to the end."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, request: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        lowered = head.lower()
        if b"transfer-encoding: chunked" in lowered:
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).strip(), 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            length = int(lowered.split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def raw_request(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[str, int, bytes]:
    parsed = httpx.URL(url)
    payload = json.dumps(body).encode()
    lines = [
        f"POST {parsed.raw_path.decode()} HTTP/1.1",
        f"host: {parsed.host}:{parsed.port}",
        "content-type: application/json",
        f"content-length: {len(payload)}",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    return parsed.host, int(parsed.port or 80), ("\r\n".join(lines) + "\r\n\r\n").encode() + payload


@dataclass
class Phase:
    name: str
    latencies_s: list[float]
    errors: int
    elapsed_s: float
    cpu_s: float = 0.0  # CPU time the gateway process used during the phase

    @property
    def rps(self) -> float:
        return len(self.latencies_s) / self.elapsed_s

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    def __add__(self, other: Phase) -> Phase:
        return Phase(
            self.name,
            self.latencies_s + other.latencies_s,
            self.errors + other.errors,
            self.elapsed_s + other.elapsed_s,
            self.cpu_s + other.cpu_s,
        )


def process_cpu_s(pid: int) -> float:
    """user + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(
    name: str,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    concurrency: int,
    duration_s: float,
    watch_pid: int | None = None,
    rate: float | None = None,
) -> Phase:
    """`concurrency` clients, each on its own keep-alive connection, for `duration_s`: closed loop
    (each sends its next request as soon as the last one ends), or with `rate`, requests arriving
    at `rate` per second in all (Poisson), each client taking the next arrival when it is free.
    Latency counts from the arrival, not the send, so a client that falls behind shows it."""
    host, port, request = raw_request(url, body, headers)
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + duration_s
    arrivals = random.Random(0)
    next_arrival = time.perf_counter()

    async def client() -> None:
        nonlocal errors, next_arrival
        connection = RawConnection(host, port)
        try:
            while time.perf_counter() < deadline:
                start = time.perf_counter()
                if rate is not None:
                    start = next_arrival = max(next_arrival, start - 1.0) + arrivals.expovariate(rate)
                    await asyncio.sleep(max(0.0, start - time.perf_counter()))
                try:
                    ok = await connection.post(request) == 200
                except (OSError, asyncio.IncompleteReadError, ValueError):
                    ok = False
                    connection.close()
                    connection = RawConnection(host, port)
                if ok:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors += 1
        finally:
            connection.close()

    cpu_before = process_cpu_s(watch_pid) if watch_pid else 0.0
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    cpu = process_cpu_s(watch_pid) - cpu_before if watch_pid else 0.0
    return Phase(name, latencies, errors, elapsed, cpu)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {timeout_s}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.bench_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--chunks", type=int, default=8, help="text chunks the stub streams per request")
    parser.add_argument(
        "--rate", type=float, help="requests/s offered in all (Poisson arrivals) instead of a closed loop"
    )
    parser.add_argument("--serve-stub", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_stub:
        serve_stub(args.serve_stub, args.chunks)
        return 0

    python = sys.executable
    stub_port, gateway_port = free_port(), free_port()
    admin_token = "bench-admin-token-0123456789abcdefghij"
    workdir = Path(tempfile.mkdtemp(prefix="edgerun-bench-"))
    env = {
        **os.environ,
        "EDGERUN_SQLITE_PATH": str(workdir / "gateway.sqlite3"),
        "EDGERUN_ADMIN_TOKEN": admin_token,
        "EDGERUN_TOKENIZER_CACHE_DIR": str(workdir / "tokenizers"),
        "EDGERUN_LOG_LEVEL": "warning",
        "EDGERUN_MODELS": json.dumps([{"id": MODEL_ID, "backend_model": "stub", "block_size": 16}]),
        "EDGERUN_BACKENDS": json.dumps(
            [{"id": "stub", "base_url": f"http://127.0.0.1:{stub_port}", "region": "local", "models": [MODEL_ID]}]
        ),
    }
    env.pop("EDGERUN_REDIS_URL", None)
    stub = subprocess.Popen(
        [python, "-m", "gateway.bench_overhead", "--serve-stub", str(stub_port), "--chunks", str(args.chunks)]
    )
    gateway = subprocess.Popen([python, "-m", "gateway.cli", "serve", "--port", str(gateway_port)], env=env)
    try:
        wait_http(f"http://127.0.0.1:{stub_port}/health")
        wait_http(f"http://127.0.0.1:{gateway_port}/healthz")
        admin = {"authorization": f"Bearer {admin_token}"}
        base = f"http://127.0.0.1:{gateway_port}"
        tenant = httpx.post(
            f"{base}/admin/v1/tenants", json={"name": "bench", "account_ids": ["bench"]}, headers=admin
        ).json()["result"]
        key = httpx.post(f"{base}/admin/v1/tenants/{tenant['id']}/keys", json={}, headers=admin).json()["result"][
            "secret"
        ]

        direct_url = f"http://127.0.0.1:{stub_port}/v1/completions"
        direct_body = {"model": "stub", "prompt": list(range(40)), "max_tokens": args.chunks, "stream": True}
        gateway_url = f"{base}/client/v4/accounts/bench/ai/run/{MODEL_ID}"
        gateway_body = {"prompt": PROMPT, "max_tokens": args.chunks, "stream": True}
        auth = {"authorization": f"Bearer {key}"}

        async def run_all() -> tuple[Phase, Phase]:
            await drive("warm-up", gateway_url, gateway_body, auth, args.concurrency, 2.0)
            await drive("warm-up", direct_url, direct_body, {}, args.concurrency, 1.0)
            # Alternate short rounds so both sides see the same machine (other load drifts).
            slice_s = args.duration / ROUNDS
            direct = through = None
            for _ in range(ROUNDS):
                d = await drive("direct", direct_url, direct_body, {}, args.concurrency, slice_s, rate=args.rate)
                g = await drive(
                    "gateway", gateway_url, gateway_body, auth, args.concurrency, slice_s, gateway.pid, args.rate
                )
                direct, through = (d, g) if direct is None else (direct + d, through + g)  # type: ignore[operator]
            assert direct is not None and through is not None
            return direct, through

        direct, through = asyncio.run(run_all())
    finally:
        for process in (gateway, stub):
            process.terminate()
        for process in (gateway, stub):
            process.wait(timeout=15)

    command = "python -m gateway.bench_overhead " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    print(report(direct, through, args, command.strip()))
    return 0 if through.errors == 0 else 1


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def report(direct: Phase, through: Phase, args: argparse.Namespace, command: str) -> str:
    rows = [
        ("requests/s", f"{direct.rps:.0f}", f"{through.rps:.0f}", ""),
        *(
            (
                f"latency p{int(q * 100)} (ms)",
                f"{direct.pct(q):.2f}",
                f"{through.pct(q):.2f}",
                f"{through.pct(q) - direct.pct(q):+.2f}",
            )
            for q in (0.5, 0.9, 0.99)
        ),
        (
            "mean latency (ms)",
            f"{statistics.fmean(direct.latencies_s) * 1000:.2f}",
            f"{statistics.fmean(through.latencies_s) * 1000:.2f}",
            "",
        ),
        (
            "requests (errors)",
            f"{len(direct.latencies_s)} ({direct.errors})",
            f"{len(through.latencies_s)} ({through.errors})",
            "",
        ),
        ("gateway CPU per request (ms)", "", f"{through.cpu_s / max(1, len(through.latencies_s)) * 1000:.2f}", ""),
    ]
    lines = [
        f"`{command}`  ",
        f"machine: {machine()}  ",
        f"{args.concurrency} concurrent streaming clients "
        f"({'closed loop' if args.rate is None else f'{args.rate:g} requests/s offered, Poisson'}, keep-alive), "
        f"{args.chunks} chunks per answer, "
        f"{args.duration:g}s through the gateway and {args.duration:g}s direct, alternating in {ROUNDS} rounds",
        "",
        "| metric | direct to stub | through gateway | added |",
        "| --- | ---: | ---: | ---: |",
        *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
