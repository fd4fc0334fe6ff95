"""A backend that answers like vLLM started without --enable-prompt-tokens-details, for tests.

    python -m tests.gateway.vllm_stub --port PORT

`/v1/completions` streams one text chunk per request (with `token_ids` when asked for) and a
final usage chunk with no `prompt_tokens_details`, as vLLM does then; the continuous usage on the
text chunk has none either. It serves the benchmarks stub's tokenizer at /edgerun/v1/tokenizer
(so no tokenizer_dir is needed) and no /load. `GET /_test/bodies` returns every completion request
body it got, for tests that check what the gateway sent.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from tests.gateway.stub_backend import CHATML, stub_tokenizer_json


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def app() -> Starlette:
    bodies: list[dict[str, Any]] = []
    tokenizer = {
        "model": "stub",
        "tokenizer_json": stub_tokenizer_json(),
        "chat_template": CHATML,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "max_model_len": 4096,
    }

    async def stream(body: dict[str, Any]) -> AsyncIterator[bytes]:
        num_prompt = len(body["prompt"]) if isinstance(body["prompt"], list) else len(body["prompt"].split())
        usage = {"prompt_tokens": num_prompt, "completion_tokens": 1, "total_tokens": num_prompt + 1}
        choice: dict[str, Any] = {"index": 0, "text": " ok", "finish_reason": "length"}
        if body.get("return_token_ids"):
            choice["token_ids"] = [42]
        yield _event({"id": "cmpl-1", "object": "text_completion", "choices": [choice], "usage": usage})
        yield _event({"id": "cmpl-1", "object": "text_completion", "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"

    async def completions(request: Request) -> StreamingResponse:
        body = await request.json()
        bodies.append(body)
        return StreamingResponse(stream(body), media_type="text/event-stream")

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({})

    async def served_tokenizer(request: Request) -> JSONResponse:
        return JSONResponse(tokenizer)

    async def seen(request: Request) -> JSONResponse:
        return JSONResponse(bodies)

    return Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/health", health),
        Route("/edgerun/v1/tokenizer", served_tokenizer),
        Route("/_test/bodies", seen),
    ])


def command(port: int) -> list[str]:
    return [sys.executable, "-m", "tests.gateway.vllm_stub", "--port", str(port)]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gateway.vllm_stub")
    parser.add_argument("--port", type=int, required=True)
    port = parser.parse_args().port
    uvicorn.run(app(), host="127.0.0.1", port=port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
