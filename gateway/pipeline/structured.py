"""JSON mode: a client's `response_format` read into the form every backend takes.

Clients send it three ways, all read here:

- Workers AI: `{"type": "json_schema", "json_schema": <the schema>}` or `{"type": "json_object"}`
  (developers.cloudflare.com/workers-ai/json-mode), and `guided_json: <schema>` on some models.
- OpenAI: `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`,
  `{"type": "json_object"}`, `{"type": "text"}` (no constraint).
- OpenAI Responses: `text: {"format": ...}` with the same types, a json_schema's `name`, `schema`,
  `strict` and `description` directly in `format` (`parse_text_format`).

Backends get trtllm-serve's shape (`response_format` on /v1/completions, which vLLM and SGLang
take too): `{"type": "json_object"}` or `{"type": "json_schema", "json_schema": {"name", "schema"}}`.
The backend's grammar guarantees the answer parses and matches the schema unless `max_tokens`
cuts it first: the answer then ends with finish_reason "length" and may not parse (Workers AI's
`response` is then the raw text rather than an object).

Every schema is checked here before it is forwarded (`check_schema`): an integer outside the 64-bit
range anywhere in it is a 400 naming its path (contracts/schema_integers.py), never a backend's 500.
"""

from __future__ import annotations

from typing import Any

from contracts.schema_integers import wide_integer
from gateway.errors import InvalidInput

MAX_SCHEMA_CHARS = 65_536  # a larger schema is almost surely a mistake, and compiling it costs the backend


def _schema(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{param} must be a JSON Schema object, got {type(value).__name__}", param=param)
    if len(repr(value)) > MAX_SCHEMA_CHARS:
        raise InvalidInput(f"{param} is larger than {MAX_SCHEMA_CHARS} characters", param=param)
    check_schema(value, param, param.split(".")[0])
    return value


def check_schema(schema: dict[str, Any], path: str, param: str) -> None:
    """Refuse a schema that no backend can compile for certain: one with an integer outside the
    64-bit range (`path`: where the schema is in the request, for the message)."""
    problem = wide_integer(schema, path)
    if problem is not None:
        raise InvalidInput(problem, param=param)


def json_schema_format(schema: dict[str, Any], name: str = "response") -> dict[str, Any]:
    """The backend `response_format` that constrains the answer to `schema`."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def parse_response_format(value: Any, *, openai: bool) -> dict[str, Any] | None:
    """The backend `response_format` for a client's, or None for plain text."""
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidInput(
            'response_format must be an object with a type: "text", "json_object" or "json_schema"',
            param="response_format",
        )
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        raise InvalidInput(
            f'response_format.type {kind!r} is not supported: use "text", "json_object" or "json_schema"',
            param="response_format",
        )
    spec = value.get("json_schema")
    if openai:  # {"name", "schema", "strict", "description"}
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise InvalidInput(
                "response_format.json_schema must be an object with a name and a schema", param="response_format"
            )
        schema = spec.get("schema", {})
        return json_schema_format(_schema(schema, "response_format.json_schema.schema"), spec["name"])
    return json_schema_format(_schema(spec, "response_format.json_schema"))


def parse_guided_json(value: Any) -> dict[str, Any] | None:
    """Workers AI's `guided_json` (a schema) as a backend `response_format`."""
    return None if value is None else json_schema_format(_schema(value, "guided_json"))


def parse_text_format(value: Any) -> dict[str, Any] | None:
    """The Responses API's `text` (`{"format": {...}}`) as a backend `response_format`."""
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"format", "verbosity"}:
        raise InvalidInput('text must be an object with a format: {"format": {"type": "json_schema", ...}}',
                           param="text")
    if value.get("verbosity") not in (None, "medium"):
        raise InvalidInput("text.verbosity is not supported: the served models take no verbosity control; use "
                           "max_output_tokens", param="text")
    fmt = value.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise InvalidInput('text.format.type must be "text", "json_object" or "json_schema"', param="text")
    if fmt["type"] != "json_schema":
        return None if fmt["type"] == "text" else {"type": "json_object"}
    if not isinstance(fmt.get("name"), str):
        raise InvalidInput("text.format needs a name for a json_schema format", param="text")
    return json_schema_format(_schema(fmt.get("schema"), "text.format.schema"), fmt["name"])
