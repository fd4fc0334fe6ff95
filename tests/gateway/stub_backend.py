"""A backend that answers at once, for measuring what sits in front of it (the gateway, metering).

    python -m tests.gateway.stub_backend --port PORT [--chunks 8] [--chunk-delay-ms 0] [--reuse-port] [--fail-guided]
        [--prefix-cache]

A tiny Starlette app speaking the streaming /v1/completions protocol plus the routes the gateway
polls (health, load, KV events, tokenizer), /v1/embeddings (each text's vector: [its length, 1.0];
for a catalog model of task "Text Embeddings" on the stub), and /v1/chat/completions for a router that passes chat
requests through (benchmarks/gateway/sglang_router.py). Every answer streams `--chunks` text chunks and a
usage chunk. Its tokenizer is a small byte-level BPE trained at start-up, with a ChatML template,
so a gateway in front does its real per-request work (template, tokenize, hash, route, meter,
re-encode the stream). With `--chunk-delay-ms` each chunk waits that long first: a slow backend
holding many streams open (benchmarks/gateway/streams.py). With `--reuse-port` several stub processes
bind one port and the kernel spreads connections over them, so the stub keeps up with several
gateway workers (benchmarks/gateway/workers.py). With `--fail-guided` every request with a `response_format`
is answered 500, as by a backend whose grammar library fails on what one client sends (the tests
of outlier ejection: one tenant's failed answers must not eject a backend). Its usage says 0 cached
tokens, unless `--prefix-cache`: then a completion's cached tokens are those of its prompt's leading
full 16-token blocks that began an earlier prompt with the same `cache_salt` (`PrefixCache`, as
vLLM's prefix cache counts them), so the tests of the cached-token discount can use it.

`start_stub` runs one as a child process, `start_gateway` an `edgerun serve` in front of it, and
`create_key` a tenant and key through that gateway's admin API: the gateway tests where the model adds
nothing and the gateway benchmarks use them alike.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from cli.processes import ROOT, ChildProcess, free_port

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MODEL_ID = "@cf/edgerun/bench-stub"
ADMIN_TOKEN = "bench-admin-token-0123456789abcdefghij"  # settings want >= 32 characters
PROMPT = "Summarise the design of an inference gateway in front of regional GPU backends, in one line."


def command(
    port: int, num_chunks: int = 8, chunk_delay_ms: float = 0.0, reuse_port: bool = False, fail_guided: bool = False,
    prefix_cache: bool = False,
) -> list[str]:
    """The argv that starts the stub on `port` as its own process (one of several with `reuse_port`)."""
    argv = [sys.executable, "-m", "tests.gateway.stub_backend", "--port", str(port), "--chunks", str(num_chunks)]
    argv += ["--chunk-delay-ms", str(chunk_delay_ms)] if chunk_delay_ms else []
    argv += ["--prefix-cache"] if prefix_cache else []
    return argv + (["--reuse-port"] if reuse_port else []) + (["--fail-guided"] if fail_guided else [])


def gateway_env(stub_port: int) -> dict[str, str]:
    """The EDGERUN_* settings that put the stub behind a gateway as its only backend."""
    return {
        "EDGERUN_MODELS": json.dumps([{"id": MODEL_ID, "backend_model": "stub", "block_size": 16}]),
        "EDGERUN_BACKENDS": json.dumps(
            [{"id": "stub", "base_url": f"http://127.0.0.1:{stub_port}", "region": "local", "models": [MODEL_ID]}]
        ),
    }


def start_stub(num_chunks: int, chunk_delay_ms: float = 0.0) -> ChildProcess:
    port = free_port()
    stub = ChildProcess.launch("stub", command(port, num_chunks, chunk_delay_ms), port)
    stub.wait_ready("/health")
    return stub


def start_gateway(
    stub_port: int,
    workdir: Path,
    env: Mapping[str, str] | None = None,
    *,
    cwd: Path = ROOT,
    args: Sequence[str] = (),
) -> ChildProcess:
    """`edgerun serve` with the local store under `workdir`, the stub as its one backend; `env` adds or
    overrides; `cwd`: the checkout it runs from (a baseline); `args`: more `edgerun serve` options."""
    workdir.mkdir(parents=True, exist_ok=True)
    settings = {
        "EDGERUN_SQLITE_PATH": str(workdir / "gateway.sqlite3"),
        "EDGERUN_ADMIN_TOKEN": ADMIN_TOKEN,
        "EDGERUN_TOKENIZER_CACHE_DIR": str(workdir / "tokenizers"),
        "EDGERUN_LOG_LEVEL": "warning",
        **gateway_env(stub_port),
        **(env or {}),
    }
    gateway = ChildProcess.spawn("gateway", "serve", args, env=settings, cwd=cwd)
    gateway.wait_ready("/healthz")
    return gateway


def create_key(base: str, account: str, **tenant: object) -> str:
    """A new tenant owning `account` (extra `tenant` fields as the admin API takes them) and its API key."""
    admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    body = {"name": "bench", "account_ids": [account], **tenant}
    created = httpx.post(f"{base}/admin/v1/tenants", json=body, headers=admin).json()["result"]
    key = httpx.post(f"{base}/admin/v1/tenants/{created['id']}/keys", json={}, headers=admin).json()["result"]
    return str(key["secret"])


def stub_tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|im_start|>", "<|im_end|>"], show_progress=False)
    corpus = [PROMPT, CHATML, *(f"the gateway routes request {i} to backend {i % 7}" for i in range(500))]
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer.to_str()


class PrefixCache:
    """The full blocks of token ids that began earlier prompts, per `cache_salt`, as chained hashes (at
    most `max_blocks`, then forgotten all at once: a stub's bound)."""

    BLOCK = 16

    def __init__(self, max_blocks: int = 100_000) -> None:
        self.max_blocks = max_blocks
        self.blocks: set[int] = set()

    def cached(self, prompt: object, salt: object) -> int:
        """The prompt's leading tokens found cached (never its last one, as vLLM), then remembered."""
        if not isinstance(prompt, list):
            return 0
        if len(self.blocks) > self.max_blocks:
            self.blocks.clear()
        chain, num_cached, hit = hash(str(salt)), 0, True
        for start in range(0, len(prompt) - 1 - self.BLOCK + 1, self.BLOCK):
            chain = hash((chain, tuple(prompt[start:start + self.BLOCK])))
            hit = hit and chain in self.blocks
            num_cached += self.BLOCK if hit else 0
            self.blocks.add(chain)
        return num_cached


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def stub_app(num_chunks: int, chunk_delay_ms: float = 0.0, fail_guided: bool = False, prefix_cache: bool = False) -> Any:
    import asyncio

    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    payload = {
        "model": "stub",
        "tokenizer_json": stub_tokenizer_json(),
        "chat_template": CHATML,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "max_model_len": 8192,
    }

    cache = PrefixCache() if prefix_cache else None

    async def stream(num_prompt: int, chat: bool, num_cached: int = 0) -> AsyncIterator[bytes]:
        kind = "chat.completion.chunk" if chat else "text_completion"
        for i in range(num_chunks):
            if chunk_delay_ms:
                await asyncio.sleep(chunk_delay_ms / 1000)
            finish = "length" if i == num_chunks - 1 else None
            text: dict[str, Any] = {"delta": {"content": " tok"}} if chat else {"text": " tok"}
            yield _event({"id": "x", "object": kind, "choices": [{"index": 0, **text, "finish_reason": finish}]})
        usage = {
            "prompt_tokens": num_prompt,
            "completion_tokens": num_chunks,
            "total_tokens": num_prompt + num_chunks,
            "prompt_tokens_details": {"cached_tokens": num_cached},
        }
        yield _event({"id": "x", "object": kind, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"

    async def completions(request: Request) -> Response:
        body = await request.json()
        if fail_guided and body.get("response_format") is not None:
            return JSONResponse({"error": {"message": "the grammar failed to compile (stub --fail-guided)"}}, 500)
        prompt = body["prompt"]
        num_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        num_cached = cache.cached(prompt, body.get("cache_salt")) if cache is not None else 0
        return StreamingResponse(stream(num_prompt, chat=False, num_cached=num_cached), media_type="text/event-stream")

    async def chat_completions(request: Request) -> StreamingResponse:
        """The same stream as chat chunks; prompt tokens: the messages' words (no template, no tokenizer)."""
        messages = (await request.json())["messages"]
        num_prompt = sum(len(str(m.get("content", "")).split()) for m in messages)
        return StreamingResponse(stream(num_prompt, chat=True), media_type="text/event-stream")

    async def embeddings(request: Request) -> JSONResponse:
        texts = (await request.json())["input"]
        data = [{"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0]} for i, t in enumerate(texts)]
        tokens = sum(len(t.split()) for t in texts)
        return JSONResponse({"object": "list", "data": data, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

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
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/embeddings", embeddings, methods=["POST"]),
            Route("/health", health),
            Route("/load", load),
            Route("/kv_cache_events", kv_events, methods=["POST"]),
            Route("/edgerun/v1/tokenizer", tokenizer),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m tests.gateway.stub_backend", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=8, help="text chunks streamed per answer")
    parser.add_argument("--chunk-delay-ms", type=float, default=0.0, help="wait before each chunk (a slow backend)")
    parser.add_argument(
        "--backlog", type=int, default=8192, help="listen backlog (thousands of streams connect at once)"
    )
    parser.add_argument("--reuse-port", action="store_true", help="bind with SO_REUSEPORT (one of several stubs)")
    parser.add_argument("--fail-guided", action="store_true", help="answer 500 to every request with a response_format")
    parser.add_argument("--prefix-cache", action="store_true", help="report cached tokens of repeated prompt prefixes")
    args = parser.parse_args(argv)
    app = stub_app(args.chunks, args.chunk_delay_ms, args.fail_guided, args.prefix_cache)
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        backlog=args.backlog,
        timeout_keep_alive=30,
    )
    server = uvicorn.Server(config)
    if args.reuse_port:
        from gateway.http.listeners import reuse_port_socket

        server.run(sockets=[reuse_port_socket(config)])
    else:
        server.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
