"""Workers AI's finetunes API: `.../ai/finetunes` (create, list), `.../ai/finetunes/{id}/finetune-assets`
(upload a PEFT file, multipart) and `DELETE .../ai/finetunes/{id}`. Thin: the service is
gateway/pipeline/finetunes.py."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from gateway.errors import InvalidInput
from gateway.http import envelopes
from gateway.http.api_inference import _authenticate, _body, services
from gateway.http.body import read_bounded
from gateway.http.envelopes import JSONBytes
from gateway.http.multipart import form_fields
from gateway.pipeline.finetunes import render

MULTIPART_SLACK = 64 * 1024  # room for the form's boundaries and text fields around the file


async def create_finetune(request: Request) -> Response:
    """POST /client/v4/accounts/{account_id}/ai/finetunes  {model, name, description}"""
    principal = await _authenticate(request)
    finetune = await services(request).finetunes.create(principal, await _body(request))
    return JSONBytes(envelopes.workers_ai_success(render(finetune)))


async def list_finetunes(request: Request) -> Response:
    """GET /client/v4/accounts/{account_id}/ai/finetunes"""
    principal = await _authenticate(request)
    found = await services(request).finetunes.list(principal)
    return JSONBytes(envelopes.workers_ai_success([render(f) for f in found]))


async def upload_asset(request: Request) -> Response:
    """POST .../ai/finetunes/{finetune_id}/finetune-assets  multipart: file, file_name"""
    principal = await _authenticate(request)
    g = services(request)
    raw = await read_bounded(request, g.settings.finetunes.finetune_max_bytes + MULTIPART_SLACK)
    fields = form_fields(request.headers.get("content-type"), raw)
    if "file" not in fields:
        raise InvalidInput("the form needs a file field (the adapter file)", param="file")
    file_name = fields.get("file_name", b"").decode("utf-8", "replace").strip()
    finetune = await g.finetunes.upload(principal, request.path_params["finetune_id"], file_name, fields["file"])
    return JSONBytes(envelopes.workers_ai_success(render(finetune)))


async def delete_finetune(request: Request) -> Response:
    """DELETE /client/v4/accounts/{account_id}/ai/finetunes/{finetune_id}"""
    principal = await _authenticate(request)
    await services(request).finetunes.delete(principal, request.path_params["finetune_id"])
    return JSONBytes(envelopes.workers_ai_success(None))
