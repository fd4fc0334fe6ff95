"""The OpenAPI document and the app agree: every route documented, nothing documented that is not
routed, and the documented bodies name exactly the fields the parsers take."""

from __future__ import annotations

import re

import schemathesis

from gateway.http.app import routes
from gateway.http.openapi import (
    OPENAI_CHAT_BODY,
    OPENAI_COMPLETIONS_BODY,
    OPENAI_RESPONSES_BODY,
    OPERATIONS,
    openapi_document,
)
from gateway.pipeline.request_fields import OPENAI_CHAT, OPENAI_COMPLETIONS, OPENAI_RESPONSES, Treatment


def openapi_path(starlette_path: str) -> str:
    """Starlette's `{model:path}` as OpenAPI's `{model}`."""
    return re.sub(r"\{(\w+):\w+\}", r"{\1}", starlette_path)


def routed() -> set[tuple[str, str]]:
    return {
        (openapi_path(route.path), method.lower())
        for route in routes()
        for method in route.methods or ()
        if method != "HEAD"  # Starlette adds HEAD to every GET
    }


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    assert routed() == set(OPERATIONS)


def test_the_openai_bodies_name_the_fields_the_gateway_accepts() -> None:
    bodies = ((OPENAI_CHAT_BODY, OPENAI_CHAT), (OPENAI_COMPLETIONS_BODY, OPENAI_COMPLETIONS),
              (OPENAI_RESPONSES_BODY, OPENAI_RESPONSES))
    for body, rules in bodies:
        accepted = {name for name, rule in rules.items() if rule.treatment is not Treatment.REFUSED}
        assert set(body["properties"]) == accepted
        # A field honoured since is documented at once, untyped (described only) until openapi.py types it.


def test_the_document_loads_as_openapi_with_every_operation() -> None:
    schema = schemathesis.openapi.from_dict(openapi_document())
    operations = {(op.path, op.method.lower()) for op in (result.ok() for result in schema.get_all_operations())}
    assert operations == set(OPERATIONS)
