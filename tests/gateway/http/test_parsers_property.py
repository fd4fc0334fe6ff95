"""Property tests of the request parsers: whatever a client sends (arbitrary JSON, deep nesting,
huge numbers, NaN and infinities, lone surrogates, oversized strings), each parser either returns
or raises its own typed error (a 4xx), never anything else (a 500). The live counterpart, with
the ledger checked too, is tests/gateway/e2e/test_openapi_fuzz.py."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.http.client_headers import parse_metadata
from gateway.http.strict_json import MAX_DEPTH, JSONRejected, loads_strict
from gateway.pipeline.embedding_input import parse_openai_embedding, parse_workers_ai_embedding
from gateway.pipeline.schemas import MAX_PROMPT_CHARS, parse_chat_completions, parse_completions, parse_workers_ai

PARSERS = (parse_workers_ai, parse_chat_completions, parse_completions, parse_workers_ai_embedding, parse_openai_embedding)
FIELDS = ("prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
          "repetition_penalty", "frequency_penalty", "presence_penalty", "stream", "raw", "stop", "n", "logprobs",
          "stream_options", "model", "text", "input", "encoding_format", "role", "content")
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(
    st.none(), st.booleans(), st.text(max_size=20),
    st.integers(), st.integers(min_value=-(10**40), max_value=10**40),  # past int64 and float range
    st.floats(allow_nan=True, allow_infinity=True),  # json.loads never makes these; a caller might
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=20,
)
bodies = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)


def parses_or_refuses(parser: Any, body: dict[str, Any]) -> None:
    try:
        parser(body)
    except GatewayError as exc:
        assert 400 <= exc.status < 500, exc


@SETTINGS
@given(bodies)
def test_arbitrary_bodies_parse_or_are_refused_with_a_4xx(body: dict[str, Any]) -> None:
    for parser in PARSERS:
        parses_or_refuses(parser, dict(body))


@SETTINGS
@given(st.sampled_from(FIELDS), st.sampled_from([10**400, -(10**400), 2**63, 2**64, float("nan"), float("inf"),
                                                 -float("inf"), 1e308, 5e-324, True]))
def test_huge_and_non_finite_numbers_in_any_field_are_refused_or_bounded(field: str, number: Any) -> None:
    for parser in PARSERS:
        parses_or_refuses(parser, {"prompt": "hi", "messages": [{"role": "user", "content": "hi"}],
                                   "text": "hi", "input": "hi", "model": "m", field: number})


@SETTINGS
@given(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.sampled_from(["prompt", "text", "stop", "key"]))
def test_lone_surrogates_never_pass_the_body_reader(surrogate: str, where: str) -> None:
    raw = json.dumps({where: f"a{surrogate}b"})  # a \udxxx escape: valid JSON, not valid Unicode text
    try:
        loads_strict(raw.encode())
    except JSONRejected:
        return
    raise AssertionError(f"{raw!r} was accepted")


@given(st.integers(min_value=MAX_DEPTH + 1, max_value=50_000), st.sampled_from(["[", '{"a":']))
@settings(max_examples=25, deadline=None)
def test_deep_nesting_is_refused_without_a_recursion_error(depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    raw = opener * depth + "1" + closer * depth
    try:
        loads_strict(raw.encode())
    except JSONRejected:
        return
    raise AssertionError(f"{depth} levels were accepted")


@given(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]))
def test_nan_and_infinity_literals_are_refused(literal: str) -> None:
    try:
        value = loads_strict(f'{{"temperature": {literal}}}'.encode())
    except JSONRejected:
        return
    # 1e999 parses as inf in Python: the body reader must refuse it like the literals
    raise AssertionError(f"{literal} parsed as {value!r}")


def test_oversized_strings_are_refused_by_the_parsers() -> None:
    huge = "x" * (MAX_PROMPT_CHARS + 1)
    # (messages have no length of their own: the body's max_body_bytes and the model's context bound them)
    for parser, body in ((parse_workers_ai, {"prompt": huge}), (parse_workers_ai_embedding, {"text": huge}),
                         (parse_workers_ai_embedding, {"text": ["ok", huge]})):
        try:
            parser(body)
        except GatewayError as exc:
            assert exc.status == 400
        else:
            raise AssertionError(f"{parser.__name__} took {len(huge)} characters")


@SETTINGS
@given(st.text(max_size=200) | st.builds(json.dumps, values))
def test_metadata_headers_parse_or_are_refused_with_a_4xx(raw: str) -> None:
    try:
        parse_metadata(raw)
    except GatewayError as exc:
        assert 400 <= exc.status < 500
