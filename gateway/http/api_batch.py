"""The batch calls of `POST /ai/run/{model}` (Workers AI's asynchronous batch API, gateway/pipeline/batch.py):
queue a batch, or poll one by its request_id. Thin: parse, one store call, render."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.context import Principal
from gateway.errors import BatchNotFound, RateLimited
from gateway.fleet.catalog import ModelSpec
from gateway.http import envelopes
from gateway.http.envelopes import JSONBytes
from gateway.pipeline.batch import BatchCall, batch_id_or_none, batch_result, parse_items, queued_result
from gateway.services import Services
from gateway.store.queue import NewBatch

QUEUE_FULL_RETRY_S = 30.0


async def batch(request: Request, g: Services, principal: Principal, model: ModelSpec, body: dict[str, Any],
                call: BatchCall) -> Response:
    """The answer to a batch call (`call`, as `gateway.pipeline.batch.batch_call` found it)."""
    model_name = request.path_params["model"]
    queue = g.store.queue
    if call == "poll":
        batch_id = batch_id_or_none(body.get("request_id"))
        state = None if batch_id is None else await queue.state(principal.tenant.id, batch_id)
        if state is None:
            raise BatchNotFound(f"No batch request {body.get('request_id')!r} for this account (or its results "
                                "have expired)", param="request_id")
        return JSONBytes(envelopes.workers_ai_success(batch_result(state, model_name)))
    s = g.settings.batch
    items = parse_items(body, model, s.batch_max_queued_items)
    batch_id = str(uuid.uuid4())
    new = NewBatch(batch_id, principal.tenant.id, principal.account_id, principal.key.id, model.id,
                   tuple(item.to_json() for item in items))
    if not await queue.enqueue(new, s.batch_max_queued_items, s.batch_max_queued_bytes):
        queued, size = await queue.queued_items(principal.tenant.id)
        raise RateLimited(
            f"Too many batch requests queued: this account has {queued} items ({size} bytes) waiting and may "
            f"have at most {s.batch_max_queued_items} items and {s.batch_max_queued_bytes} bytes; retry when "
            "some are answered", retry_after_s=QUEUE_FULL_RETRY_S,
        )
    return JSONBytes(envelopes.workers_ai_success(queued_result(batch_id, model_name)))
