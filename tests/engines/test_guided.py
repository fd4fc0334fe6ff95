"""Guided decoding in the built-in engine: the output always parses and validates.

The random 2-layer model (`tiny_runner`, byte-level vocabulary) writes noise when free, so any
valid JSON it produces comes from the grammar alone: it is the strictest check, run over
hypothesis-generated schemas. The real SmolLM2 is checked on a batch that mixes guided and free
rows (the free row must answer exactly as it does alone).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engines.base import GenerationRequest
from engines.builtin.grammar.mask import allocate_bitmask, apply_bitmask, unpack_bitmask
from engines.builtin.runner.model_runner import ModelRunner
from engines.errors import InvalidRequest
from engines.guided import Guide
from engines.sampling_params import SamplingParams
from tests.engines.test_llm_engine import chat, make_engine, run, tokens_of


def test_bitmask_forbids_exactly_the_cleared_bits() -> None:
    vocab = 70  # not a multiple of 32: the last word is partial
    bitmask = allocate_bitmask(2, vocab)
    bitmask[0] = 0
    bitmask[0, 1] = 1 << 3  # only token 35 allowed in row 0
    bitmask[1, 2] = ~(1 << 1)  # row 1: everything but token 65
    logits = apply_bitmask(torch.zeros(2, vocab), bitmask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [35]
    assert torch.isinf(logits[1]).nonzero().flatten().tolist() == [65]
    assert unpack_bitmask(bitmask, vocab).sum().item() == 1 + vocab - 1


def test_bitmask_forbids_head_rows_past_the_vocabulary() -> None:
    logits = apply_bitmask(torch.zeros(1, 100), allocate_bitmask(1, 64))  # a head wider than the tokenizer
    assert torch.isfinite(logits[0, :64]).all() and torch.isinf(logits[0, 64:]).all()


def guided(request_id: str, prompt: list[int], guide: Guide, max_tokens: int, **kw: Any) -> GenerationRequest:
    return GenerationRequest(request_id, prompt, SamplingParams(max_tokens=max_tokens, guide=guide, **kw))


def text_of(runner: ModelRunner, outputs: list) -> str:
    return "".join(o.new_text for o in outputs)


# Small schemas whose every instance is short, so a random model finishes them within the budget.
LEAVES = st.one_of(
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span}, st.integers(-50, 50), st.integers(0, 99)),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.lists(st.sampled_from(["red", "green", "blue", 1, None]), min_size=1, max_size=3, unique=True).map(lambda v: {"enum": v}),
)
SCHEMAS = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, inner, st.integers(0, 2)),
        st.dictionaries(st.sampled_from(["a", "id", "name", "ok"]), inner, min_size=1, max_size=3).map(
            lambda props: {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}
        ),
    ),
    max_leaves=4,
)


@pytest.mark.slow
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS, seed=st.integers(1, 1000))
def test_random_model_output_validates_against_generated_schemas(tiny_runner: ModelRunner, schema: dict, seed: int) -> None:
    engine = make_engine(tiny_runner)
    prompt = tiny_runner.tokenizer.encode("JSON please: ")
    request = guided("r", prompt, Guide.json_schema(schema), max_tokens=160, temperature=1.0, seed=seed)
    outputs = run(engine, request)["r"]
    assert outputs[-1].finish_reason == "stop", text_of(tiny_runner, outputs)
    jsonschema.validate(json.loads(text_of(tiny_runner, outputs)), schema)


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS)
def test_smollm2_output_validates_against_generated_schemas(smollm2_fast_runner: ModelRunner, schema: dict) -> None:
    engine = make_engine(smollm2_fast_runner)
    prompt = chat(smollm2_fast_runner, f"Answer with JSON matching this schema: {json.dumps(schema)}")
    outputs = run(engine, guided("r", prompt, Guide.json_schema(schema), max_tokens=96, temperature=0.0))["r"]
    text = text_of(smollm2_fast_runner, outputs)
    assert outputs[-1].finish_reason == "stop", text
    jsonschema.validate(json.loads(text), schema)


@pytest.mark.slow
def test_json_object_mode_gives_an_object_even_from_noise(tiny_runner: ModelRunner) -> None:
    engine = make_engine(tiny_runner)
    prompt = tiny_runner.tokenizer.encode("x")
    # any JSON object; a random model may nest for long, so the budget is generous and only a
    # finished answer is parsed (a cut one is checked to be a prefix by the next test)
    outputs = run(engine, guided("r", prompt, Guide("json_object"), max_tokens=400, temperature=0.7, seed=3))["r"]
    if outputs[-1].finish_reason == "stop":
        assert isinstance(json.loads(text_of(tiny_runner, outputs)), dict)
    else:
        assert text_of(tiny_runner, outputs).startswith("{")


@pytest.mark.slow
def test_max_tokens_cuts_a_guided_answer_with_finish_reason_length(smollm2_fast_runner: ModelRunner) -> None:
    engine = make_engine(smollm2_fast_runner)
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    prompt = chat(smollm2_fast_runner, "Tell me a long story as JSON.")
    outputs = run(engine, guided("r", prompt, Guide.json_schema(schema), max_tokens=6, temperature=0.0))["r"]
    assert outputs[-1].finish_reason == "length"
    text = text_of(smollm2_fast_runner, outputs)
    assert text.startswith('{"story"')
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)  # cut: the client is told by finish_reason "length"


@pytest.mark.slow
def test_a_mixed_batch_constrains_only_guided_rows(smollm2_fast_runner: ModelRunner) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer", "minimum": 0, "maximum": 99_999_999}},
        "required": ["city", "population"],
    }
    prompt = chat(smollm2_fast_runner, "What is the largest city of France? Answer in JSON.")
    free = GenerationRequest("free", prompt, SamplingParams(max_tokens=16, temperature=0.0))
    alone = tokens_of(run(make_engine(smollm2_fast_runner), free)["free"])
    engine = make_engine(smollm2_fast_runner)
    outputs = run(
        engine,
        GenerationRequest("free", prompt, SamplingParams(max_tokens=16, temperature=0.0)),
        guided("schema", prompt, Guide.json_schema(schema), max_tokens=40, temperature=0.0),
        guided("object", prompt, Guide("json_object"), max_tokens=40, temperature=0.8, seed=7),
    )
    assert tokens_of(outputs["free"]) == alone
    answer = json.loads(text_of(smollm2_fast_runner, outputs["schema"]))
    jsonschema.validate(answer, schema)
    assert outputs["schema"][-1].finish_reason == "stop"
    if outputs["object"][-1].finish_reason == "stop":
        assert isinstance(json.loads(text_of(smollm2_fast_runner, outputs["object"])), dict)
    assert engine.grammars.num_compiles == 2


def test_a_structural_tag_leaves_text_free_and_constrains_the_tagged_call(tiny_runner: ModelRunner) -> None:
    engine = make_engine(tiny_runner)
    tok = tiny_runner.tokenizer
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}
    guide = Guide.structural_tag([{"begin": "<call>", "schema": schema, "end": "</call>"}], ["<call>"])
    matcher = engine.grammars.matcher(guide)

    def allowed_now() -> torch.Tensor:
        bitmask = allocate_bitmask(1, engine.vocab_size)
        matcher.fill_bitmask(bitmask, 0)
        return unpack_bitmask(bitmask, engine.vocab_size)[0]

    def feed(text: str) -> None:
        assert all(matcher.accept(t) for t in tok.encode(text)), text

    feed("free words, {even braces} ")
    assert allowed_now()[tok.encode("x")].all() and allowed_now()[sorted(tok.eos_token_ids)].any()  # text may end
    feed("<call>")
    assert allowed_now()[tok.encode("{")].all() and not allowed_now()[tok.encode("x")].any()  # the call's JSON
    feed('{"n": 7')
    assert not allowed_now()[tok.encode(", ")[0]]  # a closed object: no second key
    feed("}</call> and on")
    assert allowed_now()[tok.encode("x")].all()  # free again after the tag


def test_a_schema_that_cannot_compile_is_an_invalid_request(tiny_runner: ModelRunner) -> None:
    engine = make_engine(tiny_runner)
    with pytest.raises(InvalidRequest, match="json schema"):
        engine.grammars.compile(Guide.json_schema({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "integer", "minimum": 2**64},
        {"enum": ["a", 2**64]},
        {"type": "object", "properties": {"n": {"type": "integer", "default": -(2**63) - 1}}},
    ],
)
def test_a_schema_whose_integers_the_library_cannot_read_is_an_invalid_request(
    tiny_runner: ModelRunner, schema: dict[str, Any]
) -> None:
    """llguidance raises ValueError on integers past 64 bits: a client's fault, never the backend's 500."""
    engine = make_engine(tiny_runner)
    with pytest.raises(InvalidRequest, match="cannot be compiled"):  # past Guide's own check (a caller may skip it)
        engine.grammars.compile(Guide("json_schema", json.dumps(schema)))
    with pytest.raises(InvalidRequest, match=r"schema\..* is -?\d+, outside the 64-bit integer range"):
        Guide.json_schema(schema)
    structures = [{"begin": "<call>", "schema": schema, "end": "</call>"}]
    with pytest.raises(InvalidRequest, match=r"structures\[0\]\.schema.* outside the 64-bit"):
        Guide.structural_tag(structures, ["<call>"])


def test_properties_are_written_in_the_schema_order(tiny_runner: ModelRunner) -> None:
    engine = make_engine(tiny_runner)
    schema = {"type": "object", "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "integer"}},
              "required": ["zeta", "alpha"]}
    tok = tiny_runner.tokenizer
    first = engine.grammars.matcher(Guide.json_schema(schema))
    assert all(first.accept(t) for t in tok.encode('{"zeta": 1, "alpha": 2}'))
    wrong = engine.grammars.matcher(Guide.json_schema(schema))
    assert not all(wrong.accept(t) for t in tok.encode('{"alpha"'))
