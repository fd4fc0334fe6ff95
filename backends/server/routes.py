"""The backend's HTTP endpoints: parse, call the generation service, render. No logic beyond that."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backends.server import disagg
from backends.server.disconnect import until_disconnect
from backends.server.errors import APIError, BadRequest, ModelNotFound
from backends.server.generation import Generation
from backends.server.kv_feed import InvalidConsumer
from backends.server.openai import Kind, Renderer
from backends.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from backends.server.state import BackendState
from backends.server.tokenizer_route import ROUTE as TOKENIZER_ROUTE
from contracts.reject_if_busy import REJECT_IF_BUSY_HEADER
from contracts.request_id import REQUEST_ID_HEADER, is_valid
from contracts.sse import DONE, EventStream, event

DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's (and trtllm-serve's) default for /v1/completions


def backend(request: Request) -> BackendState:
    state: BackendState = request.app.state.backend
    return state


def engine_request_id(request: Request, prefix: str, state: BackendState) -> str:
    """`<prefix>-<the gateway's request id>` when it sent a usable `x-request-id`, so a gateway log
    line can be followed into this backend's; else a fresh id. The same id twice at once (never
    from our gateway) gets a suffix, since the engine keys requests by id."""
    incoming = request.headers.get(REQUEST_ID_HEADER)
    if incoming is None or not is_valid(incoming):
        return f"{prefix}-{uuid.uuid4().hex}"
    request_id = f"{prefix}-{incoming}"
    if state.admission.is_active(request_id):
        return f"{request_id}-{uuid.uuid4().hex[:8]}"
    return request_id


async def read_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


async def completions(request: Request) -> Response:
    state = backend(request)
    body = CompletionRequest.model_validate(await read_json(request))
    engine = state.ready_engine()
    prompt = body.prompt
    # the validator left one prompt: its text or its token ids
    prompt_ids = cast(list[int], list(prompt)) if isinstance(prompt, list) else engine.tokenizer.encode(prompt)
    max_tokens = body.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS
    return await _generate(request, state, body, prompt_ids, max_tokens, "completion")


async def chat_completions(request: Request) -> Response:
    state = backend(request)
    body = ChatCompletionRequest.model_validate(await read_json(request))
    engine = state.ready_engine()
    if body.prompt_token_ids is not None:  # a generation step: the context step's tokens
        prompt_ids = list(body.prompt_token_ids)
    else:
        prompt_ids = engine.tokenizer.encode_chat(
            body.chat_messages(), add_generation_prompt=body.add_generation_prompt
        )
    max_tokens = body.max_completion_tokens or body.max_tokens or state.default_max_tokens(len(prompt_ids))
    return await _generate(request, state, body, prompt_ids, max_tokens, "chat")


async def _generate(
    request: Request, state: BackendState, body: SamplingFields, prompt_ids: list[int], max_tokens: int, kind: Kind
) -> Response:
    lora = state.adapter_of(body.model)
    params = disagg.context_params(body)
    disagg.check_role(state, params)
    if lora is not None and params is not None:
        raise BadRequest("LoRA adapters are not served in disaggregated steps: send the request whole", param="model")
    prefix = "cmpl" if kind == "completion" else "chatcmpl"
    request_id = engine_request_id(request, prefix, state)
    renderer = Renderer(request_id, state.model_name, kind, return_token_ids=body.return_token_ids)
    sampling = body.sampling_params(max_tokens)
    may_queue = request.headers.get(REJECT_IF_BUSY_HEADER) != "1"  # contracts/reject_if_busy.py
    if params is not None and params.request_type == "context_only":  # answered at once, never streamed
        context = disagg.context_step(
            state, renderer, params, prompt_ids, sampling, body.cache_salt, body.return_token_ids, may_queue=may_queue
        )
        return await until_disconnect(request.receive, context)
    if params is not None:  # generation_only
        start = disagg.start_generation_step(
            state, kind, renderer.request_id, params, prompt_ids, sampling, body.cache_salt, may_queue=may_queue
        )
    else:
        start = state.service.start(
            kind, renderer.request_id, prompt_ids, sampling, body.cache_salt, may_queue=may_queue, lora=lora
        )
    generation = await until_disconnect(request.receive, start)
    if body.stream:
        return EventStream(
            _events(generation, renderer, body.include_usage, body.continuous_usage), on_close=generation.close
        )
    try:
        completion = await until_disconnect(request.receive, generation.collect())
    finally:
        await generation.close()
    return JSONResponse(renderer.answer(completion))


async def _events(
    generation: Generation, renderer: Renderer, include_usage: bool, continuous_usage: bool
) -> AsyncIterator[bytes]:
    try:
        async for output in generation:
            chunk = renderer.chunk(output)
            if chunk is not None:
                if continuous_usage:
                    chunk["usage"] = renderer.usage_so_far(output)
                yield event(chunk)
    except APIError as exc:  # the status line is gone: report it in-band, as OpenAI servers do
        yield event(renderer.error_chunk(exc.status, exc.type, exc.message))
        yield DONE
        return
    if include_usage and generation.last is not None:
        yield event(renderer.usage_chunk(generation.last))
    yield DONE


async def health(request: Request) -> Response:
    admission = backend(request).admission
    return JSONResponse({"status": admission.phase.value}, 200 if admission.is_ready else 503)


async def models(request: Request) -> Response:
    state = backend(request)
    engine = state.ready_engine()
    card = {
        "id": state.model_name,
        "object": "model",
        "created": state.started_at,
        "owned_by": "edgerun",
        "max_model_len": engine.max_model_len,
    }
    # resident LoRA adapters, as vLLM lists them: a model each, its parent the base model
    adapters = [{"id": name, "object": "model", "created": state.started_at, "owned_by": "edgerun",
                 "parent": state.model_name, "max_model_len": engine.max_model_len}
                for name in engine.stats().resident_adapters]
    return JSONResponse({"object": "list", "data": [card, *adapters]})


async def unload_lora_adapter(request: Request) -> Response:
    """vLLM's `POST /v1/unload_lora_adapter {lora_name}`: the gateway's call when a finetune is deleted."""
    name = (await read_json(request)).get("lora_name")
    if not isinstance(name, str) or not name:
        raise BadRequest("'lora_name' needs to be provided to unload a LoRA adapter.", param="lora_name")
    if not await backend(request).unload_adapter(name):
        raise ModelNotFound(f"The lora adapter '{name}' cannot be found.", param="lora_name")
    return JSONResponse(f"Success: LoRA adapter '{name}' removed successfully.")


async def metrics(request: Request) -> Response:
    return Response(backend(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def kv_cache_events(request: Request) -> Response:
    """TensorRT-LLM's poll: the events this consumer has not read yet (`?consumer=<id>`; a poll
    without one is a consumer of its own, so trtllm's plain drain keeps working)."""
    try:
        return JSONResponse(backend(request).kv_events(request.query_params.get("consumer")))
    except InvalidConsumer as exc:
        raise BadRequest(str(exc), param="consumer") from exc


async def load(request: Request) -> Response:
    return JSONResponse(backend(request).load())


ROUTES = [
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/v1/models", models, methods=["GET"]),
    Route("/v1/unload_lora_adapter", unload_lora_adapter, methods=["POST"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/kv_cache_events", kv_cache_events, methods=["POST"]),
    Route("/load", load, methods=["GET"]),
    TOKENIZER_ROUTE,  # GET /edgerun/v1/tokenizer: lets the gateway tokenize exactly as we do
]
