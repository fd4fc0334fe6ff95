"""`edgerun chat`: talk to the built-in engine in the terminal, or answer one `--prompt` and exit.

The engine runs on an event loop in a background thread (it loads on a thread that exits, so that
the engine's own thread holds the only OpenMP team: engines/omp.py); the terminal (blocking
`input()`) stays in the main thread, so Ctrl-C is always delivered there: during a reply it stops the reply
(the request is aborted in the engine) and returns to the prompt; at the prompt, or on EOF
(Ctrl-D), the session ends cleanly.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Any

from engines.base import GenerationRequest
from engines.builtin.config import EngineConfig
from engines.omp import may_bound_omp_spinning, on_own_thread
from engines.sampling_params import SamplingParams


class ChatSession:
    """A multi-turn conversation with a built-in engine it owns (start on init, `close()` at the end)."""

    def __init__(self, config: EngineConfig, sampling: SamplingParams, system: str | None = None) -> None:
        may_bound_omp_spinning()  # as the backend does
        from engines.builtin.engine.async_engine import AsyncEngine

        self.sampling = sampling
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="edgerun-chat-loop", daemon=True)
        self._thread.start()
        # loaded on a thread that exits, not here: this thread lives on, and an OpenMP team of its
        # own would make the engine's thread sleep at every parallel op (engines/omp.py)
        self.engine: AsyncEngine = self._call(on_own_thread(AsyncEngine, config, name="edgerun-engine-load"))
        self._call(self.engine.start())

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def reply(self, text: str, write: Callable[[str], None]) -> str:
        """Send one user turn, stream the answer through `write`, return it (partial if interrupted)."""
        self.messages.append({"role": "user", "content": text})
        prompt_ids = self.engine.tokenizer.encode_chat(self.messages)
        max_tokens = max(1, min(self.sampling.max_tokens, self.engine.max_model_len - len(prompt_ids)))
        sampling = SamplingParams(**{**_fields(self.sampling), "max_tokens": max_tokens})
        parts: list[str] = []
        future = asyncio.run_coroutine_threadsafe(self._stream(prompt_ids, sampling, parts, write), self._loop)
        try:
            future.result()
        except KeyboardInterrupt:
            future.cancel()  # cancels the task: leaving generate() aborts the request
            with _suppress_cancelled():
                future.result(timeout=5)
            write("\n[stopped]")
        answer = "".join(parts)
        self.messages.append({"role": "assistant", "content": answer})
        return answer

    async def _stream(
        self, prompt_ids: list[int], sampling: SamplingParams, parts: list[str], write: Callable[[str], None]
    ) -> None:
        request = GenerationRequest(f"chat-{uuid.uuid4().hex}", prompt_ids, sampling)
        async for output in self.engine.generate(request):
            if output.new_text:
                parts.append(output.new_text)
                write(output.new_text)

    def close(self) -> None:
        try:
            self._call(self.engine.stop(timeout_s=1.0))
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()


class _suppress_cancelled:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, value: BaseException | None, tb: object) -> bool:
        expected = (concurrent.futures.CancelledError, concurrent.futures.TimeoutError)
        return kind is not None and issubclass(kind, expected)


def _fields(sampling: SamplingParams) -> dict[str, Any]:
    return {name: getattr(sampling, name) for name in SamplingParams.__dataclass_fields__}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--prompt", help="answer this one prompt, then exit")
    add("--system", help="system message for the conversation")
    add("--model", default="smollm2", help='"smollm2", a .gguf file, a safetensors directory or "random:<preset>"')
    add("--device", default="cpu", help="cpu or cuda[:N]")
    add("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    add("--mode", default="fast", choices=["fast", "deterministic"], help="fast (default) or the exact float32 model")
    add("--max-tokens", type=int, default=256, help="longest reply, in tokens")
    add("--temperature", type=float, default=0.6, help="0 = greedy (Workers AI's default is 0.6)")
    add("--top-p", type=float, default=1.0)
    add("--top-k", type=int, default=None)
    add("--seed", type=int, default=None)


def logging_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"level": "warning", "json": False}  # the terminal is for the conversation


def run(args: argparse.Namespace) -> int:
    sampling = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed
    )
    config = EngineConfig(model=args.model, device=args.device, dtype=args.dtype, mode=args.mode)
    interactive = args.prompt is None
    if interactive:
        print(f"edgerun chat: loading {args.model} ...", file=sys.stderr, flush=True)
    session = ChatSession(config, sampling, args.system)

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    try:
        if not interactive:
            session.reply(args.prompt, write)
            write("\n")
            return 0
        print("Type a message; Ctrl-C stops a reply, Ctrl-D (or Ctrl-C at the prompt) quits.", file=sys.stderr)
        while True:
            try:
                text = input("> ")
            except (EOFError, KeyboardInterrupt):
                write("\n")
                return 0
            if text.strip():
                session.reply(text, write)
                write("\n")
    finally:
        session.close()
