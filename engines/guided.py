"""What a constrained request asks the engine's output to match (guided decoding).

The forms follow the OpenAI-compatible `response_format` of trtllm-serve and vLLM:

- `json_object`: any JSON object (OpenAI's "JSON mode").
- `json_schema`: a JSON value valid against `spec`, a JSON Schema (as JSON text).
- `structural_tag`: free text in which every occurrence of a trigger starts a tag whose body must
  match its schema: `spec` is `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}` as
  JSON text. Function calling with `tool_choice: auto` uses it: the model may answer in words or
  call a declared function, and a call's arguments always match its parameters.

A `Guide` is frozen and hashable (its spec is compact JSON text, keys in the client's order: the
answer writes properties in schema order), so compiled grammars are cached by it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from contracts.schema_integers import wide_integer
from engines.errors import InvalidRequest

GuideKind = Literal["json_object", "json_schema", "structural_tag"]
KINDS: tuple[GuideKind, ...] = ("json_object", "json_schema", "structural_tag")


@dataclass(frozen=True, slots=True)
class Guide:
    kind: GuideKind
    spec: str = ""  # compact JSON text; empty for json_object

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequest(f"guided decoding kind {self.kind!r} is not one of {', '.join(KINDS)}")

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool) -> Guide:
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequest("a JSON schema must be an object (or true / false)")
        _check_integers(schema, "schema")
        return cls("json_schema", compact_json(schema))

    @classmethod
    def structural_tag(cls, structures: list[dict[str, Any]], triggers: list[str]) -> Guide:
        for item in structures:
            if not isinstance(item, dict) or not isinstance(item.get("begin"), str) or not isinstance(item.get("end"), str):
                raise InvalidRequest("each structural tag needs string begin and end and a schema")
            if not any(item["begin"].startswith(t) for t in triggers):
                raise InvalidRequest(f"the structural tag {item['begin']!r} starts with none of the triggers")
        for i, item in enumerate(structures):
            _check_integers(item.get("schema"), f"structures[{i}].schema")
        if not triggers or not all(isinstance(t, str) and t for t in triggers):
            raise InvalidRequest("structural tags need at least one non-empty trigger")
        return cls("structural_tag", compact_json({"structures": structures, "triggers": triggers}))

    @property
    def value(self) -> Any:
        return json.loads(self.spec) if self.spec else None


def _check_integers(schema: Any, path: str) -> None:
    """A schema with an integer past 64 bits cannot be compiled (contracts/schema_integers.py)."""
    problem = wide_integer(schema, path)
    if problem is not None:
        raise InvalidRequest(problem)


def closed_objects(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that lists `properties`
    and says nothing about others (xgrammar's strict mode, vLLM's and trtllm-serve's default). The
    output still validates against the original; a small model no longer invents keys forever."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {k: (v if k in ("enum", "const", "default", "examples") else closed_objects(v)) for k, v in schema.items()}
    if "properties" in schema and isinstance(schema["properties"], dict):
        closed["properties"] = {name: closed_objects(s) for name, s in schema["properties"].items()}
        if "additionalProperties" not in schema and "patternProperties" not in schema:
            closed["additionalProperties"] = False
    return closed


def compact_json(value: Any) -> str:
    # keys keep their order: a schema's property order is the order the answer writes them in
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
