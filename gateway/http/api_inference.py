"""Inference endpoints: Workers AI `ai/run`, the OpenAI-compatible routes, and the model lists.

Each handler parses, calls the services, renders; errors are `GatewayError`s rendered by the
handlers registered in `gateway.http.app` (Workers AI envelope, or OpenAI's shape under /ai/v1/).
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.context import Principal, RequestContext
from gateway.errors import InvalidInput, ModelNotFound, NoSuchModel
from gateway.fleet.catalog import EMBEDDING_TASK, ModelSpec
from gateway.http import api_batch, envelopes, render, responses
from gateway.http.body import read_json_object
from gateway.http.client_headers import cache_directive, metadata, session_id
from gateway.http.envelopes import JSONBytes
from gateway.http.listeners import listener_of
from gateway.pipeline.answer_cache import CACHE_STATUS_HEADER, Started
from gateway.pipeline.batch import QUEUE_FLAG, batch_call, queue_flag
from gateway.pipeline.embedding import Embedded
from gateway.pipeline.embedding_input import MAX_TEXTS, parse_openai_embedding, parse_workers_ai_embedding
from gateway.pipeline.generation import Generation
from gateway.pipeline.model_schema import text_embeddings_schema, text_generation_schema
from gateway.pipeline.routing import EXPLAIN_REQUEST_HEADER, EXPLAIN_RESPONSE_HEADER
from gateway.pipeline.schemas import (
    openai_model,
    parse_chat_completions,
    parse_completions,
    parse_responses,
    parse_workers_ai,
    split_finetune,
)
from gateway.services import Services


def services(request: Request) -> Services:
    found: Services = request.app.state.services
    return found


async def _authenticate(request: Request) -> Principal:
    """The calling key's tenant, which must own the account in the URL."""
    request.state.arrived_perf, request.state.arrived_at = time.perf_counter(), time.time()
    principal = await services(request).auth.authenticate(
        request.headers.get("authorization"), request.path_params["account_id"]
    )
    request.state.tenant = principal.tenant.id
    return principal


async def _admitted(request: Request) -> Principal:
    """Authenticated and counted against the key's requests per minute, before the body is read:
    strangers and keys over their limit cost no parsing or tokenizing, and invalid requests count."""
    principal = await _authenticate(request)
    await services(request).auth.admit_request(principal)
    return principal


async def _body(request: Request) -> dict[str, Any]:
    g = services(request)
    return await read_json_object(request, g.settings.http.max_body_bytes, offload=g.offload)


def _model(request: Request, principal: Principal, model_id: str) -> ModelSpec:
    """The model, which must be in the catalog and allowed to the tenant and the key."""
    g = services(request)
    model = g.catalog.get(model_id)
    request.state.model = model.id
    g.auth.authorize_model(principal, model.id)
    return model


async def _context(request: Request, principal: Principal, model: ModelSpec, lora: str | None = None) -> RequestContext:
    """The request's one context (gateway/context.py), built once its caller and model are known; `lora`: the
    finetune the request names (its account's own, else 404), recorded in the ledger record's metadata."""
    finetune = await services(request).finetunes.resolve(principal, model, lora) if lora is not None else None
    meta = metadata(request)
    if finetune is not None:
        meta = {**meta, "lora": finetune.id, "lora_name": finetune.name}
    return RequestContext(
        request_id=request.state.request_id,
        principal=principal,
        model=model,
        session_id=session_id(request),
        arrived_perf=request.state.arrived_perf,
        arrived_at=request.state.arrived_at,
        metadata=meta,
        adapter=finetune.id if finetune is not None else None,
    )


async def run_model(request: Request) -> Response:
    """POST /client/v4/accounts/{account_id}/ai/run/{model}; with `queueRequest` or a `request_id`, a batch
    call (gateway/http/api_batch.py): with ?queueRequest=true the body may be batch_max_payload_bytes."""
    g = services(request)
    principal = await _admitted(request)
    model = _model(request, principal, request.path_params["model"])
    # (a URL without a query string, nearly every request, is not parsed)
    queued_in_url = bool(request.scope.get("query_string")) and queue_flag(request.query_params.get(QUEUE_FLAG))
    limit = g.settings.batch.batch_max_payload_bytes if queued_in_url else g.settings.http.max_body_bytes
    body = await read_json_object(request, limit, offload=g.offload)
    call = batch_call(body, queued_in_url)
    if call is not None:
        return await api_batch.batch(request, g, principal, model, body, call)
    if model.task == EMBEDDING_TASK:
        texts = parse_workers_ai_embedding(body)
        embedded = await _embed(request, principal, model, texts)
        if embedded is None:
            return Response(status_code=render.CLIENT_CLOSED_REQUEST)
        return JSONBytes(envelopes.workers_ai_success(envelopes.workers_ai_embeddings(embedded.vectors)))
    inp = parse_workers_ai(body)
    started = await g.answers.start(await _context(request, principal, model, inp.lora), inp, "run", cache_directive(request))
    request.state.backend = started.backend_id
    return _answered(request, started, await render.workers_ai_response(started.answer, inp, request.receive))


async def _openai(request: Request, *, chat: bool) -> Response:
    g = services(request)
    principal = await _admitted(request)  # before the body: strangers never get JSON parsed
    body = await _body(request)
    name, lora = split_finetune(openai_model(body))
    model = _model(request, principal, name)
    if model.task == EMBEDDING_TASK:
        raise InvalidInput(f"{model.id} is an embedding model: send it to /ai/v1/embeddings", param="model")
    inp = parse_chat_completions(body) if chat else parse_completions(body)
    ctx = await _context(request, principal, model, lora)
    started = await g.answers.start(ctx, inp, "chat" if chat else "completions", cache_directive(request))
    request.state.backend = started.backend_id
    response = await render.openai_response(started.answer, inp, request.receive, chat=chat)
    return _answered(request, started, response)


def _answered(request: Request, started: Started, response: Response) -> Response:
    """The response with the cache's verdict, when the request asked the cache, and the routing
    decision of a live answer, when an admin asked for it."""
    if started.cache_status is not None:
        response.headers[CACHE_STATUS_HEADER] = started.cache_status
    if isinstance(started.answer, Generation):
        return _explained(request, started.answer, response)
    return response


def _explained(request: Request, generation: Generation, response: Response) -> Response:
    """The routing decision in a response header, for an admin who asks (gateway/pipeline/routing.py): the
    request's x-edgerun-explain must be the admin token (a wrong one counts as a failed admin attempt)."""
    client = request.client.host if request.client is not None else None
    explain = request.headers.get(EXPLAIN_REQUEST_HEADER)
    if services(request).admin_guard.matches(explain, client, listener_of(request.scope)):
        response.headers[EXPLAIN_RESPONSE_HEADER] = generation.flight.explanation
    return response


async def _embed(request: Request, principal: Principal, model: ModelSpec, texts: tuple[str, ...]) -> Embedded | None:
    """The vectors, or None when the client hung up first (the request is then cancelled: recorded `cancelled`
    at no cost, its backend request closed)."""
    work = services(request).embedder.embed(await _context(request, principal, model), texts)
    embedded = await render.unless_disconnected(work, request.receive)
    if embedded is not None:
        request.state.backend = embedded.endpoint.id
    return embedded


async def embeddings(request: Request) -> Response:
    """POST /client/v4/accounts/{account_id}/ai/v1/embeddings"""
    principal = await _admitted(request)
    body = await _body(request)
    model = _model(request, principal, openai_model(body))
    if model.task != EMBEDDING_TASK:
        raise InvalidInput(f"{model.id} is a {model.task} model, not an embedding model", param="model")
    texts, encoding = parse_openai_embedding(body)
    embedded = await _embed(request, principal, model, texts)
    if embedded is None:
        return Response(status_code=render.CLIENT_CLOSED_REQUEST)
    answer = envelopes.openai_embeddings(model.id, embedded.vectors, embedded.usage, base64=encoding == "base64")
    return JSONBytes(answer)


async def create_response(request: Request) -> Response:
    """POST /client/v4/accounts/{account_id}/ai/v1/responses (OpenAI's Responses API, text in and out)"""
    g = services(request)
    principal = await _admitted(request)
    body = await _body(request)
    model = _model(request, principal, openai_model(body))
    if model.task == EMBEDDING_TASK:
        raise InvalidInput(f"{model.id} is an embedding model: send it to /ai/v1/embeddings", param="model")
    inp = parse_responses(body)
    generation = await g.generator.start(await _context(request, principal, model), inp.generation)
    request.state.backend = generation.endpoint.id
    return _explained(request, generation, await responses.responses_response(generation, inp, request.receive))


async def chat_completions(request: Request) -> Response:
    """POST /client/v4/accounts/{account_id}/ai/v1/chat/completions"""
    return await _openai(request, chat=True)


async def completions(request: Request) -> Response:
    """POST /client/v4/accounts/{account_id}/ai/v1/completions"""
    return await _openai(request, chat=False)


def _page_param(request: Request, name: str, default: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= hi:
        raise InvalidInput(f"{name} must be an integer between 1 and {hi}", param=name)
    return int(raw)


def _may_use(principal: Principal, model_id: str) -> bool:
    return principal.tenant.allows_model(model_id) and principal.key.allows_model(model_id)


async def search_models(request: Request) -> Response:
    """GET /client/v4/accounts/{account_id}/ai/models/search (Workers AI's shape, paginated)."""
    g = services(request)
    principal = await _authenticate(request)
    q = request.query_params
    found = [
        m
        for m in g.catalog.search(search=q.get("search"), task=q.get("task"), author=q.get("author"),
                                  capabilities=q.get("capabilities"))
        if _may_use(principal, g.catalog.get(m["name"]).id)
    ]
    page, per_page = _page_param(request, "page", 1, 1_000_000), _page_param(request, "per_page", 50, 1000)
    items = found[(page - 1) * per_page : page * per_page]
    body = envelopes.workers_ai_success(items)
    body["result_info"] = {"page": page, "per_page": per_page, "count": len(items), "total_count": len(found)}
    return JSONBytes(body)


async def list_models(request: Request) -> Response:
    """GET /client/v4/accounts/{account_id}/ai/v1/models (OpenAI's list): the ids and aliases this key may use."""
    g = services(request)
    principal = await _authenticate(request)
    data = [g.catalog.openai_model(name) for name, model in g.catalog.names() if _may_use(principal, model.id)]
    return JSONBytes({"object": "list", "data": data})


async def get_model(request: Request) -> Response:
    """GET /client/v4/accounts/{account_id}/ai/v1/models/{model}: one of them, else 404 (as OpenAI, a model
    the key may not use answers as one that does not exist)."""
    g = services(request)
    principal = await _authenticate(request)
    name = request.path_params["model"]
    try:
        model = g.catalog.get(name)
    except NoSuchModel:
        model = None
    if model is None or not _may_use(principal, model.id):
        raise ModelNotFound(f"The model {name} does not exist or this key may not use it", param="model")
    return JSONBytes(g.catalog.openai_model(name))


async def model_schema(request: Request) -> Response:
    """GET /client/v4/accounts/{account_id}/ai/models/schema?model=ID (an alias too): input and output schemas."""
    principal = await _authenticate(request)
    model_id = request.query_params.get("model")
    if not model_id:
        raise InvalidInput("model is required: ?model=@cf/huggingface/smollm2-135m-instruct", param="model")
    model = _model(request, principal, model_id)
    schema = text_embeddings_schema(MAX_TEXTS) if model.task == EMBEDDING_TASK else text_generation_schema()
    return JSONBytes(envelopes.workers_ai_success(schema))
