"""Workers AI's asynchronous batch API: a batch request's body -> its items, and the answers' shapes.

`POST /ai/run/{model}` with `{"requests": [...]}` and `queueRequest` (`?queueRequest=true`, or
`"queueRequest": true` in the body) queues the items and answers at once `{"status": "queued",
"request_id", "model"}`; the same URL with `{"request_id": ...}` answers `queued` or `running`
while items are left, then `{"responses": [...], "usage": {...}}`: one entry per item, in the
request's order, `{"id": i, "result", "success", "external_reference"}` (an item that failed:
`success: false` and its `errors`). Each item is validated here as its synchronous request would
be, so a bad item refuses the whole batch at once (400, naming `requests[i]`); the items run later
(gateway/http/batch_worker.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

from gateway.errors import GatewayError, InvalidInput
from gateway.fleet.catalog import EMBEDDING_TASK, ModelSpec
from gateway.pipeline.embedding_input import parse_workers_ai_embedding
from gateway.pipeline.schemas import GenerationInput, parse_workers_ai
from gateway.store.checks import check_id
from gateway.store.errors import InvalidArgument
from gateway.store.queue import BatchState

QUEUE_FLAG = "queueRequest"
REFERENCE = "external_reference"
BatchCall = Literal["enqueue", "poll"]


def queue_flag(value: str | None) -> bool:
    """`?queueRequest=...` in the URL."""
    return value is not None and value.lower() in ("true", "1")


def batch_call(body: dict[str, Any], queued_in_url: bool) -> BatchCall | None:
    """Which batch call the body is, or None for an ordinary (synchronous) request."""
    if body.get("request_id") is not None:
        return "poll"
    if body.get(QUEUE_FLAG) is True or queued_in_url:
        return "enqueue"
    return None  # `requests` without the flag: refused by name, as a field of an ordinary request


@dataclass(frozen=True, slots=True)
class Item:
    """One queued item: its synchronous request body and the caller's reference."""

    request: dict[str, Any]
    reference: Any = None

    def to_json(self) -> str:
        return json.dumps({"request": self.request, REFERENCE: self.reference}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Item:
        data = json.loads(text)
        return cls(data["request"], data.get(REFERENCE))


def parse_items(body: dict[str, Any], model: ModelSpec, max_items: int) -> tuple[Item, ...]:
    """The batch's items, each checked as its own request to `model` would be."""
    flag = body.get(QUEUE_FLAG)
    if flag is not None and not isinstance(flag, bool):
        raise InvalidInput("queueRequest must be true or false", param=QUEUE_FLAG)
    requests = body.get("requests")
    if not isinstance(requests, list) or not requests:
        raise InvalidInput('a batch needs requests: a non-empty array of request objects, e.g. '
                           '{"requests": [{"prompt": "..."}]}', param="requests")
    if len(requests) > max_items:
        raise InvalidInput(f"a batch may hold at most {max_items} requests, this one has {len(requests)}",
                           param="requests")
    return tuple(_item(i, request, model) for i, request in enumerate(requests))


def _item(index: int, request: Any, model: ModelSpec) -> Item:
    where = f"requests[{index}]"
    if not isinstance(request, dict):
        raise InvalidInput(f"{where} must be a request object", param=where)
    fields = dict(request)
    reference = fields.pop(REFERENCE, None)
    if reference is not None and not isinstance(reference, str | int | float):
        raise InvalidInput(f"{where}.{REFERENCE} must be a string or a number", param=f"{where}.{REFERENCE}")
    try:
        if model.task == EMBEDDING_TASK:
            parse_workers_ai_embedding(fields)
        else:
            parsed = parse_workers_ai(fields)
            if parsed.stream:
                raise InvalidInput("a batch item cannot stream: its answer is read by polling", param="stream")
            if parsed.lora is not None:  # the batch worker runs base models only (gateway/pipeline/finetunes.py)
                raise InvalidInput("a batch item cannot name a finetune (lora) yet: send it on its own", param="lora")
    except GatewayError as exc:
        param = f"{where}.{exc.param}" if exc.param else where
        raise type(exc)(f"{where}: {exc.message}", param=param) from None
    return Item(fields, reference)


def generation_input(item: Item) -> GenerationInput:
    """The item's generation, never waiting for capacity (a busy item is tried again later)."""
    return replace(parse_workers_ai(item.request), stream=False, reject_if_busy=True)


def batch_id_or_none(value: Any) -> str | None:
    """A polled request_id, if it can name a batch at all."""
    try:
        return check_id("request_id", value)
    except InvalidArgument:
        return None


def answered(index: int, reference: Any, result: dict[str, Any]) -> str:
    return json.dumps({"id": index, "result": result, "success": True, REFERENCE: reference}, separators=(",", ":"))


def failed(index: int, reference: Any, error: GatewayError) -> str:
    entry = {"id": index, "result": None, "success": False, "errors": [{"code": error.code, "message": error.message}],
             REFERENCE: reference}
    return json.dumps(entry, separators=(",", ":"))


def queued_result(batch_id: str, model: str, status: str = "queued") -> dict[str, Any]:
    return {"status": status, "request_id": batch_id, "model": model}


def batch_result(state: BatchState, model_name: str) -> dict[str, Any]:
    """A poll's answer: the status while items are left, else every answer in order and their summed usage."""
    if state.status != "done":
        return queued_result(state.batch_id, model_name, state.status)
    responses = [json.loads(text) for text in state.results]
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    for response in responses:
        counted = (response.get("result") or {}).get("usage") or {}
        for name in usage:
            usage[name] += int(counted.get(name, 0))
    return {"responses": responses, "usage": usage}
