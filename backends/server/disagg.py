"""Disaggregated serving on the backend: trtllm-serve's context_only / generation_only steps.

    context_only     prefill the prompt (prefix cache first), sample the first token with the
                     request's own sampling, pin the KV blocks and answer at once (never streamed)
                     with choices[0].disaggregated_params {request_type, first_gen_tokens,
                     ctx_request_id, encoded_opaque_state}, prompt_token_ids and usage (cached
                     tokens counted). An answer that is already final (EOS, a stop string,
                     max_tokens 1) pins nothing and carries no disaggregated_params.
    generation_only  the prompt is the context step's prompt_token_ids: reserve blocks (own prefix
                     cache first), pull only the missing ones from the context backend, continue from
                     first_gen_tokens; streamed or not, like any request. Its first output is that
                     first token, so completion_tokens counts it.
    context_and_generation   an ordinary request.

Roles: a `prefill` backend refuses generation_only, a `decode` backend refuses context_only
(400, saying where to send it); `mixed` takes both. Every role serves ordinary requests (a
gateway prefills locally when little is left to prefill, or no prefill backend is healthy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.responses import JSONResponse, Response

from backends.kv_transfer.errors import FingerprintMismatch, KVTransferError, PinNotFound
from backends.kv_transfer.opaque import OpaqueState
from backends.server.errors import APIError, BadRequest, NotImplementedFeature
from backends.server.generation import Generation
from backends.server.openai import Kind, Renderer
from backends.server.protocol import DisaggregatedParams, SamplingFields
from backends.server.state import BackendState
from engines.base import GenerationOutput, GenerationRequest
from engines.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engines.builtin.engine.kv_handoff import ImportPlan  # imports torch: only backends hosting our engine load it

PENDING_FINISH_REASON = "not_finished"  # trtllm-serve's: the generation step has work left


class KVPinGone(APIError):
    status, type = 410, "kv_cache_gone"


class KVTransferFailed(APIError):
    status, type = 502, "kv_transfer_error"


def check_role(state: BackendState, params: DisaggregatedParams | None) -> None:
    role = state.settings.role
    kind = params.request_type if params is not None else None
    if role == "prefill" and kind == "generation_only":
        raise BadRequest(
            "this backend runs --role prefill: send generation_only requests to a decode or mixed backend",
            param="disaggregated_params.request_type",
        )
    if role == "decode" and kind == "context_only":
        raise BadRequest(
            "this backend runs --role decode: send context_only requests to a prefill or mixed backend",
            param="disaggregated_params.request_type",
        )
    if kind in ("context_only", "generation_only") and state.kv is None:
        raise NotImplementedFeature(
            f"{kind} needs the built-in engine on CPU with KV transfer; this backend has none",
            param="disaggregated_params",
        )


async def context_step(
    state: BackendState, renderer: Renderer, params: DisaggregatedParams, prompt_ids: list[int],
    sampling: SamplingParams, cache_salt: str | None, return_token_ids: bool, *, may_queue: bool = True,
) -> Response:
    """Prefill, sample the first token, pin the blocks; answer with what the decode side needs."""
    assert state.kv is not None
    is_last_token = sampling.max_tokens == 1
    first_only = dataclasses.replace(sampling, max_tokens=1)
    generation = await state.service.start(
        renderer.kind, renderer.request_id, prompt_ids, first_only, cache_salt, pin_kv=not is_last_token,
        may_queue=may_queue,
    )
    try:
        completion = await generation.collect()
        last = generation.last
        assert last is not None
        # registered before any other await: from here the pin is released on pull or by the TTL
        opaque = state.kv.export(last.kv_pin) if last.kv_pin is not None else None
    finally:
        await generation.close()
    body = renderer.answer(completion)
    choice = body["choices"][0]
    if last.kv_pin is not None and opaque is not None:  # pending: the decode side continues
        choice["finish_reason"] = PENDING_FINISH_REASON
        choice["disaggregated_params"] = {
            "request_type": "context_only",
            "first_gen_tokens": completion.token_ids,
            "ctx_request_id": last.kv_pin.pin_id,
            "encoded_opaque_state": opaque.encode(),
            "draft_tokens": None,
            "disagg_request_id": params.disagg_request_id,
        }
    if return_token_ids:
        choice["token_ids"] = completion.token_ids
    body["prompt_token_ids"] = prompt_ids
    return JSONResponse(body)


async def start_generation_step(
    state: BackendState, route: Kind, request_id: str, params: DisaggregatedParams, prompt_ids: list[int],
    sampling: SamplingParams, cache_salt: str | None, *, may_queue: bool = True,
) -> Generation:
    """Admit a generation step; its first output (the context step's token) arrives once the KV is in."""
    kv = state.kv
    assert kv is not None
    if not params.first_gen_tokens or params.encoded_opaque_state is None:
        raise BadRequest(
            "generation_only needs disaggregated_params.first_gen_tokens and encoded_opaque_state: copy them "
            "from the context step's answer",
            param="disaggregated_params",
        )
    try:
        source = OpaqueState.decode(params.encoded_opaque_state)
        kv.check(source, len(prompt_ids))
    except (ValueError, FingerprintMismatch) as exc:
        raise BadRequest(str(exc), param="disaggregated_params.encoded_opaque_state") from exc
    engine = kv.engine
    first_token = params.first_gen_tokens[0]

    async def fill(plan: ImportPlan) -> None:
        try:
            await kv.fill(source, plan)
        except PinNotFound as exc:
            raise KVPinGone(exc.message) from exc
        except FingerprintMismatch as exc:
            raise BadRequest(exc.message, param="disaggregated_params.encoded_opaque_state") from exc
        except KVTransferError as exc:
            raise KVTransferFailed(f"pulling the KV from the context backend failed: {exc.message}") from exc

    def submit(request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        return engine.generate_imported(request, first_token, fill)

    return await state.service.start(
        route, request_id, prompt_ids, sampling, cache_salt, submit=submit, may_queue=may_queue
    )


def context_params(body: SamplingFields) -> DisaggregatedParams | None:
    """The request's disaggregated_params when they ask for one of the two steps, else None."""
    params = body.disaggregated_params
    if params is None or params.request_type == "context_and_generation":
        return None
    return params
