"""The gateway's OpenAPI 3.1 document, served at `GET /openapi.json`.

Built from what the handlers really accept: the Workers AI input schemas of `gateway.pipeline.model_schema`
(the same fields, defaults and ranges as `gateway.schemas`), OpenAI's bodies as
`gateway.pipeline.request_fields` lists them, and the admin bodies of `gateway.api_admin`. Every error is
documented as the envelope `gateway.envelopes` renders: Workers AI's under the Workers AI and
admin routes, OpenAI's `{"error": {...}}` under `/ai/v1/`. `OPERATIONS` has one entry per
(path, method) the app routes; tests/gateway/http/test_openapi.py holds the two together, and a
schemathesis run against a live gateway checks the document against the gateway's answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.pipeline.model_schema import (
    JSON_MODE,
    MESSAGES_INPUT,
    PROMPT_INPUT,
    SAMPLING,
    STOP_AND_OPTIONS,
    TOOLS,
    USAGE,
    text_embeddings_schema,
)
from gateway.pipeline.request_fields import OPENAI_CHAT, OPENAI_COMPLETIONS, OPENAI_RESPONSES, FieldRule, Treatment
from gateway.pipeline.schemas import MAX_PROMPT_CHARS, ROLES

ACCOUNT = "/client/v4/accounts/{account_id}"
JSON = "application/json"

WORKERS_AI_ERROR: dict[str, Any] = {
    "type": "object",
    "properties": {
        "result": {"type": "null"},
        "success": {"const": False},
        "errors": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {"code": {"type": "integer"}, "message": {"type": "string"}},
                "required": ["code", "message"],
            },
        },
        "messages": {"type": "array"},
    },
    "required": ["result", "success", "errors", "messages"],
}
OPENAI_ERROR: dict[str, Any] = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
            "required": ["message", "type"],
        }
    },
    "required": ["error"],
}
SUCCESS: dict[str, Any] = {
    "type": "object",
    "properties": {"result": {}, "success": {"const": True}, "errors": {"type": "array"}, "messages": {"type": "array"}},
    "required": ["result", "success"],
}

_TEXT = {"type": "string", "minLength": 1, "maxLength": MAX_PROMPT_CHARS}
_OPENAI_SAMPLING = {
    **{name: schema for name, schema in SAMPLING.items()},
    "temperature": {**SAMPLING["temperature"], "maximum": 2},  # OpenAI's range
    "model": {"type": "string", "description": "A model id of GET .../ai/models/search."},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "stop": {"oneOf": [_TEXT, {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": 4}]},
    "n": {"type": "integer", "enum": [1]},
    "logprobs": {"enum": [False, 0, None]},
    "options": STOP_AND_OPTIONS["options"],
    **JSON_MODE,
    **TOOLS,
    "parallel_tool_calls": {"type": "boolean"},
}


def _accepted(rules: Mapping[str, FieldRule], typed: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """Every field a route accepts (request_fields.py): typed where `typed` knows it, else described
    only (so a field honoured since has its place in the document at once); ignored ones with the reason."""
    properties: dict[str, Any] = {}
    for name, rule in rules.items():
        if rule.treatment is Treatment.IGNORED:
            properties[name] = {"description": f"Accepted and ignored: {rule.reason}"}
        elif rule.treatment is Treatment.HONOURED:
            properties[name] = typed.get(name, {"description": "See the route's documentation."})
    return properties


OPENAI_CHAT_BODY: dict[str, Any] = {
    "type": "object",
    "properties": _accepted(
        OPENAI_CHAT,
        {
            **_OPENAI_SAMPLING,
            "messages": MESSAGES_INPUT["properties"]["messages"],
            "max_completion_tokens": SAMPLING["max_tokens"],
        },
    ),
    "required": ["model", "messages"],
}
OPENAI_COMPLETIONS_BODY: dict[str, Any] = {
    "type": "object",
    "properties": _accepted(
        OPENAI_COMPLETIONS,
        {
            **_OPENAI_SAMPLING,
            "prompt": {"oneOf": [_TEXT, {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": 1}]},
        },
    ),
    "required": ["model", "prompt"],
}
OPENAI_RESPONSES_BODY: dict[str, Any] = {
    "type": "object",
    "properties": _accepted(
        OPENAI_RESPONSES,
        {
            **_OPENAI_SAMPLING,
            "input": {
                "oneOf": [_TEXT, {"type": "array", "minItems": 1, "items": {"type": "object"}}],
                "description": "A string, or message items ({role, content}) oldest first.",
            },
            "instructions": {"type": "string", "description": "A system message put first."},
            "text": {
                "type": "object",
                "description": 'Output format: {"format": {"type": "text" | "json_object" | "json_schema", ...}}.',
                "properties": {"format": {"type": "object"}},
            },
            "max_output_tokens": SAMPLING["max_tokens"],
            "stream_options": {"type": "object", "properties": {"include_obfuscation": {"type": "boolean"}}},
        },
    ),
    "required": ["model", "input"],
}
OPENAI_EMBEDDINGS_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "model": {"type": "string"},
        "input": {"oneOf": [_TEXT, {"type": "array", "items": _TEXT, "minItems": 1}]},
        "encoding_format": {"enum": ["float", "base64"]},
        "user": {"type": "string"},
    },
    "required": ["model", "input"],
}
_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}}
_COUNT = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}  # gateway/api_admin.py's _optional_int
TENANT_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "account_ids": {**_STRINGS, "minItems": 1},
        "allowed_models": _STRINGS,
        "monthly_budget_micro": _COUNT,
        "id": {"type": "string"},
        "max_concurrent_requests": {**_COUNT, "minimum": 1},
    },
    "required": ["name", "account_ids"],
}
KEY_BODY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "allowed_models": _STRINGS,
        "rpm": {**_COUNT, "minimum": 1},
        "tpm": {**_COUNT, "minimum": 1},
    },
}


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}, "description": description}


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema or {"type": "string"}, "description": description}


ACCOUNT_ID = _path_param("account_id", "The account the key's tenant owns.")


def _operation(
    summary: str,
    *,
    security: str | None = "apiKey",
    body: dict[str, Any] | None = None,
    params: tuple[dict[str, Any], ...] = (),
    ok: str = "200",
    ok_types: tuple[str, ...] = (JSON,),
    openai: bool = False,
) -> dict[str, Any]:
    error = OPENAI_ERROR if openai else WORKERS_AI_ERROR
    operation: dict[str, Any] = {
        "summary": summary,
        "responses": {
            ok: {"description": "Success", "content": {t: {"schema": {}} for t in ok_types}},
            "default": {"description": "An error, in the route's error envelope", "content": {JSON: {"schema": error}}},
        },
    }
    if params:
        operation["parameters"] = list(params)
    if security is not None:
        operation["security"] = [{security: []}]
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": body}}}
    return operation


_GENERATION_TYPES = (JSON, "text/event-stream")
_BATCH_QUEUE = {  # Workers AI's asynchronous batch API (gateway/pipeline/batch.py)
    "type": "object",
    "title": "Batch",
    "required": ["requests"],
    "properties": {
        "requests": {"type": "array", "minItems": 1, "items": {"type": "object"},
                     "description": "Each a request to the model, with an optional external_reference."},
        "queueRequest": {"type": "boolean", "description": "Queue the batch (or ?queueRequest=true)."},
    },
}
_BATCH_POLL = {"type": "object", "title": "Batch poll", "required": ["request_id"],
               "properties": {"request_id": {"type": "string", "description": "A queued batch's id."}}}
_RUN_BODY = {"oneOf": [PROMPT_INPUT, MESSAGES_INPUT, text_embeddings_schema(100)["input"], _BATCH_QUEUE, _BATCH_POLL]}

# (path, method) -> operation; paths in OpenAPI's form ({model}, not Starlette's {model:path})
OPERATIONS: dict[tuple[str, str], dict[str, Any]] = {
    (f"{ACCOUNT}/ai/run/{{model}}", "post"): _operation(
        "Workers AI: run a model (text generation: prompt or messages; text embeddings: text)",
        body=_RUN_BODY,
        params=(ACCOUNT_ID, _path_param("model", "A model id, e.g. @cf/huggingface/smollm2-135m-instruct."),
                _query("queueRequest", "true: a batch call (queue {requests} or poll {request_id}); the body may "
                       "then be up to batch_max_payload_bytes", {"type": "string", "enum": ["true", "false"]})),
        ok_types=_GENERATION_TYPES,
    ),
    (f"{ACCOUNT}/ai/v1/chat/completions", "post"): _operation(
        "OpenAI-compatible chat completions", body=OPENAI_CHAT_BODY, params=(ACCOUNT_ID,),
        ok_types=_GENERATION_TYPES, openai=True,
    ),
    (f"{ACCOUNT}/ai/v1/completions", "post"): _operation(
        "OpenAI-compatible completions (raw prompt, no chat template)", body=OPENAI_COMPLETIONS_BODY,
        params=(ACCOUNT_ID,), ok_types=_GENERATION_TYPES, openai=True,
    ),
    (f"{ACCOUNT}/ai/v1/responses", "post"): _operation(
        "OpenAI-compatible Responses API (text in, text out; stored responses and tools are refused)",
        body=OPENAI_RESPONSES_BODY, params=(ACCOUNT_ID,), ok_types=_GENERATION_TYPES, openai=True,
    ),
    (f"{ACCOUNT}/ai/v1/embeddings", "post"): _operation(
        "OpenAI-compatible embeddings", body=OPENAI_EMBEDDINGS_BODY, params=(ACCOUNT_ID,), openai=True
    ),
    (f"{ACCOUNT}/ai/models/search", "get"): _operation(
        "Workers AI: the models this key may use",
        params=(
            ACCOUNT_ID,
            _query("search", "Text in the model's name or description."),
            _query("task", "A task name, e.g. Text Generation."),
            _query("author", "The model's author."),
            _query("capabilities", "LoRA: only models that accept finetunes."),
            _query("page", "Page number, from 1.", {"type": "integer", "minimum": 1}),
            _query("per_page", "Models per page.", {"type": "integer", "minimum": 1}),
        ),
    ),
    (f"{ACCOUNT}/ai/models/schema", "get"): _operation(
        "Workers AI: a model's input and output JSON Schemas",
        params=(ACCOUNT_ID, {**_query("model", "A model id."), "required": True}),
    ),
    (f"{ACCOUNT}/ai/v1/models", "get"): _operation(
        "OpenAI-compatible model list: the models and aliases this key may use", params=(ACCOUNT_ID,), openai=True
    ),
    (f"{ACCOUNT}/ai/v1/models/{{model}}", "get"): _operation(
        "OpenAI-compatible model retrieval (404 for a model this key may not use)",
        params=(ACCOUNT_ID, _path_param("model", "A model id or alias.")), openai=True,
    ),
    (f"{ACCOUNT}/ai/finetunes", "post"): _operation(
        "Workers AI: create a LoRA finetune of a base model that accepts adapters", params=(ACCOUNT_ID,),
        body={"type": "object", "required": ["model", "name"], "properties": {
            "model": {"type": "string"}, "name": {"type": "string", "minLength": 1, "maxLength": 128},
            "description": {"type": "string", "maxLength": 1024}}},
    ),
    (f"{ACCOUNT}/ai/finetunes", "get"): _operation("Workers AI: the account's finetunes", params=(ACCOUNT_ID,)),
    (f"{ACCOUNT}/ai/finetunes/{{finetune_id}}/finetune-assets", "post"): {
        **_operation("Workers AI: upload a finetune's adapter_config.json or adapter_model.safetensors (PEFT)",
                     params=(ACCOUNT_ID, _path_param("finetune_id", "The finetune's id."))),
        "requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
            "type": "object", "required": ["file", "file_name"], "properties": {
                "file": {"type": "string", "format": "binary"},
                "file_name": {"type": "string", "enum": ["adapter_config.json", "adapter_model.safetensors"]}}}}}},
    },
    (f"{ACCOUNT}/ai/finetunes/{{finetune_id}}", "delete"): _operation(
        "Delete a finetune and its files", params=(ACCOUNT_ID, _path_param("finetune_id", "The finetune's id."))
    ),
    ("/admin/v1/tenants", "post"): _operation("Create a tenant", security="adminToken", body=TENANT_BODY, ok="201"),
    ("/admin/v1/tenants", "get"): _operation("List tenants", security="adminToken"),
    ("/admin/v1/tenants/{tenant_id}/keys", "post"): _operation(
        "Create an API key for a tenant (its secret is shown once)", security="adminToken", body=KEY_BODY,
        params=(_path_param("tenant_id", "The tenant's id."),), ok="201",
    ),
    ("/admin/v1/tenants/{tenant_id}/keys", "get"): _operation(
        "List a tenant's keys (never their secrets)", security="adminToken",
        params=(_path_param("tenant_id", "The tenant's id."),),
    ),
    ("/admin/v1/keys/{key_id}", "delete"): _operation(
        "Revoke a key", security="adminToken", params=(_path_param("key_id", "The key's id."),)
    ),
    ("/admin/v1/billing/export", "get"): _operation(
        "Export usage records (CSV, JSON lines or Parquet)", security="adminToken",
        params=(
            _query("from", "Start, Unix seconds or ISO 8601."),
            _query("to", "End, Unix seconds or ISO 8601."),
            _query("tenant", "One tenant's records only."),
            _query("format", "csv, jsonl or parquet."),
            _query("part", "rows (default) or summary."),
        ),
        ok_types=("text/csv", "application/x-ndjson", "application/vnd.apache.parquet"),
    ),
    ("/healthz", "get"): _operation("Health summary (503 while no backend is healthy)", security=None),
    ("/metrics", "get"): _operation(
        "Prometheus metrics (admin listener, or metrics_token)", security="metricsToken", ok_types=("text/plain",)
    ),
    ("/openapi.json", "get"): _operation("This document", security=None),
    ("/dashboard", "get"): _operation("The usage dashboard (HTML)", security=None, ok_types=("text/html",)),
    ("/dashboard/static/{name}", "get"): _operation(
        "The dashboard's script, style and vendored files", security=None,
        params=(_path_param("name", "A file name."),), ok_types=("application/javascript", "text/css"),
    ),
    ("/dashboard/api/usage", "get"): _operation(
        "Usage figures (admin token: every tenant; a tenant's API key: its own)",
        params=(
            _query("from", "Start: Unix seconds (0 to 253402300799) or ISO 8601."),
            _query("to", "End: Unix seconds (0 to 253402300799) or ISO 8601."),
            _query("tenant", "One tenant (admin token only)."), _query("bucket", "Bucket width, seconds."),
        ),
    ),
    ("/dashboard/api/tenants", "get"): _operation("Tenants the caller may see (admin token: all)"),
}


def openapi_document(title: str = "edgerun gateway", version: str = "1") -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for (path, method), operation in OPERATIONS.items():
        paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": title,
            "version": version,
            "description": "Workers AI's REST API and its OpenAI-compatible routes, in front of edgerun's backends, "
            f"plus the operator's routes. Roles: {', '.join(ROLES)}. Usage objects: {sorted(USAGE['properties'])}.",
        },
        "paths": paths,
        "components": {
            "securitySchemes": {
                "apiKey": {"type": "http", "scheme": "bearer", "description": "A tenant's API key."},
                "adminToken": {"type": "http", "scheme": "bearer", "description": "The gateway's admin_token."},
                "metricsToken": {"type": "http", "scheme": "bearer", "description": "The gateway's metrics_token."},
            },
            "schemas": {"WorkersAIError": WORKERS_AI_ERROR, "OpenAIError": OPENAI_ERROR, "Success": SUCCESS},
        },
    }
