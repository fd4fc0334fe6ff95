"""Function calling and JSON mode at the gateway, without HTTP: parsing, prompts, grammars, calls."""

from __future__ import annotations

import json

import pytest

from gateway.errors import InvalidInput
from gateway.fleet.catalog import ModelSpec
from gateway.pipeline.schemas import parse_chat_completions, parse_responses, parse_workers_ai
from gateway.pipeline.structured import parse_response_format
from gateway.pipeline.tokenization import ModelTokenizer
from gateway.pipeline.tools import CALL_TRIGGER, CallDelta, CallStream, parse_tool_use, with_tools_prompt
from tests.gateway.fixtures_tokenizer import CHATML, payload

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {"name": "get_time", "description": "The time now.", "parameters": {"type": "object", "properties": {}}}
OPENAI_WEATHER = {"type": "function", "function": WEATHER}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
MODEL = ModelSpec(id="@cf/test/tiny", backend_model="tiny")


def test_workers_ai_and_openai_json_schema_shapes_reach_the_backend_alike() -> None:
    workers = parse_workers_ai({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": SCHEMA}})
    openai = parse_chat_completions(
        {"model": "m", "messages": [{"role": "user", "content": "x"}],
         "response_format": {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}}}
    )
    assert workers.backend_response_format == {"type": "json_schema", "json_schema": {"name": "response", "schema": SCHEMA}}
    assert openai.backend_response_format == {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}
    guided = parse_workers_ai({"prompt": "x", "guided_json": SCHEMA})
    assert guided.backend_response_format == workers.backend_response_format
    assert parse_response_format({"type": "json_object"}, openai=False) == {"type": "json_object"}
    assert parse_response_format({"type": "text"}, openai=True) is None


@pytest.mark.parametrize(
    "value",
    [{"type": "yaml"}, {"json_schema": SCHEMA}, {"type": "json_schema", "json_schema": "not a schema"}, "json"],
)
def test_a_bad_response_format_is_refused_by_name(value: object) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_workers_ai({"prompt": "x", "response_format": value})
    assert caught.value.param.startswith("response_format")


def test_both_tool_shapes_parse_and_the_system_prompt_lists_them() -> None:
    inp = parse_workers_ai({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Paris?"}],
                            "tools": [WEATHER, {"type": "function", "function": TIME}]})
    assert inp.tools is not None and [t.name for t in inp.tools.tools] == ["get_weather", "get_time"]
    assert inp.prompt.tools is inp.tools
    messages = with_tools_prompt(inp.prompt.messages, inp.tools)
    system = messages[0]
    assert system["role"] == "system" and system["content"].startswith("Be brief.\n\nYou can call")
    assert "get_weather: The weather in a city." in system["content"] and "plain text" in system["content"]
    assert messages[1:] == ({"role": "user", "content": "Paris?"},)


TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS {% for t in tools %}{{ t.function.name }} {% endfor %}<|im_end|>\n{% endif %}"
    + CHATML
)


def test_a_template_with_its_own_tool_format_gets_the_tools_and_no_fallback_prompt() -> None:
    inp = parse_chat_completions({"model": "m", "messages": [{"role": "user", "content": "the fox"}], "tools": [OPENAI_WEATHER]})
    own = ModelTokenizer.from_payload(MODEL, payload(chat_template=TOOL_TEMPLATE))
    fallback = ModelTokenizer.from_payload(MODEL, payload())
    assert own.template is not None and own.template.renders_tools
    assert fallback.template is not None and not fallback.template.renders_tools
    text, _ = own.render(inp.prompt)
    assert text.startswith("<|im_start|>system\nTOOLS get_weather <|im_end|>") and "You can call" not in text
    text, _ = fallback.render(inp.prompt)
    assert text.startswith("<|im_start|>system\nYou can call the following functions:\n- get_weather")


def test_tool_choice_auto_is_a_structural_tag_and_required_a_schema_over_the_calls() -> None:
    auto = parse_tool_use([WEATHER, TIME], None)
    fmt = auto.response_format()
    assert fmt["type"] == "structural_tag" and fmt["triggers"] == [CALL_TRIGGER]
    assert fmt["structures"][0] == {
        "begin": '{"name": "get_weather", "arguments": ', "schema": WEATHER["parameters"], "end": "}"
    }
    required = parse_tool_use([WEATHER, TIME], "required").response_format()
    assert [o["properties"]["name"] for o in required["json_schema"]["schema"]["anyOf"]] == [
        {"const": "get_weather"}, {"const": "get_time"}
    ]
    named = parse_tool_use([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert named.response_format()["json_schema"]["schema"]["properties"]["name"] == {"const": "get_time"}
    assert parse_tool_use([WEATHER], "none") is None


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([WEATHER, WEATHER], None, "tools"),
        ([{"name": "x", "parameters": "nope"}], None, "tools"),
        ([WEATHER], {"type": "function", "function": {"name": "get_time"}}, "tool_choice"),
        ([WEATHER], "sometimes", "tool_choice"),
        (None, "required", "tool_choice"),
    ],
)
def test_bad_tools_are_refused_by_name(tools: object, choice: object, param: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_tool_use(tools, choice)
    assert caught.value.param == param


def test_calls_are_cut_out_of_the_text() -> None:
    use = parse_tool_use([WEATHER, TIME], "auto")
    text = 'Let me check. {"name": "get_weather", "arguments": {"city": "Paris"}} and {"name": "nope", "arguments": {}}'
    rest, calls = use.split_calls(text)
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert rest == 'Let me check.  and {"name": "nope", "arguments": {}}'
    assert calls[0].openai()["function"]["arguments"] == '{"city": "Paris"}' and calls[0].id.startswith("call_")
    assert use.split_calls("no calls {here")[0] == "no calls {here"
    single = parse_tool_use([WEATHER, TIME], "auto", parallel_tool_calls=False)
    two = '{"name": "get_time", "arguments": {}}{"name": "get_time", "arguments": {}}'
    assert len(single.split_calls(two)[1]) == 1


def feed_all(stream: CallStream, pieces: list[str]) -> list[str | CallDelta]:
    events = [e for piece in pieces for e in stream.feed(piece)]
    return events + stream.finish()


def test_a_stream_sends_text_then_the_call_head_then_argument_pieces() -> None:
    stream = CallStream(parse_tool_use([WEATHER, TIME], "auto"))
    events = feed_all(stream, ["It is ", "{curly} ", '{"name": "get_', 'weather", "argu', 'ments": {"city": ', '"Oslo"}', "} ok"])
    text = "".join(e for e in events if isinstance(e, str))
    deltas = [e for e in events if isinstance(e, CallDelta)]
    assert text == "It is {curly}  ok"
    assert deltas[0].id is not None and deltas[0].name == "get_weather" and deltas[0].arguments == ""
    assert "".join(d.arguments for d in deltas) == '{"city": "Oslo"}'
    assert all(d.index == 0 for d in deltas) and all(d.id is None for d in deltas[1:])
    assert [(c.name, c.arguments, c.id) for c in stream.calls] == [("get_weather", {"city": "Oslo"}, deltas[0].id)]
    assert deltas[1].openai() == {"index": 0, "function": {"arguments": deltas[1].arguments}}


def test_a_required_call_is_held_whole_when_written_in_another_key_order() -> None:
    stream = CallStream(parse_tool_use([WEATHER], "required"))
    assert stream.feed('{"arguments": {"city": "Rome"}, ') == []
    (delta,) = [e for e in stream.feed('"name": "get_weather"}') + stream.finish() if isinstance(e, CallDelta)]
    assert (delta.name, json.loads(delta.arguments)) == ("get_weather", {"city": "Rome"})


def test_a_call_cut_by_max_tokens_stays_open_and_is_not_listed() -> None:
    stream = CallStream(parse_tool_use([WEATHER], "auto"))
    events = feed_all(stream, ['{"name": "get_weather", "arguments": {"ci'])
    assert stream.has_calls and not stream.calls
    assert "".join(e.arguments for e in events if isinstance(e, CallDelta)) == '{"ci'


def test_without_parallel_calls_a_second_head_is_text() -> None:
    stream = CallStream(parse_tool_use([TIME], "auto", parallel_tool_calls=False))
    call = '{"name": "get_time", "arguments": {}}'
    events = feed_all(stream, [call, call])
    assert len(stream.calls) == 1 and "".join(e for e in events if isinstance(e, str)) == call


def test_a_later_turn_carries_calls_and_results() -> None:
    inp = parse_chat_completions({
        "model": "m",
        "tools": [OPENAI_WEATHER],
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 4}'},
        ],
    })
    messages = inp.prompt.messages  # the tools' description is added when the prompt is rendered
    assert messages[1] == {"role": "assistant", "content": json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}})}
    assert messages[2] == {"role": "tool", "content": '{"temp_c": 4}'}


def test_tools_and_response_format_together_are_refused() -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_workers_ai({"prompt": "x", "tools": [WEATHER], "response_format": {"type": "json_object"}})
    assert caught.value.param == "tools"


def test_responses_text_format_becomes_the_backend_response_format() -> None:
    fmt = {"format": {"type": "json_schema", "name": "thing", "schema": SCHEMA, "strict": True}}
    inp = parse_responses({"model": "m", "input": "x", "text": fmt})
    assert inp.generation.backend_response_format == {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}
    assert inp.text_format == fmt["format"]
    assert parse_responses({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}).generation.response_format == {
        "type": "json_object"
    }
    assert parse_responses({"model": "m", "input": "x", "text": {"format": {"type": "text"}}}).generation.response_format is None
    with pytest.raises(InvalidInput) as caught:
        parse_responses({"model": "m", "input": "x", "text": {"format": {"type": "regex"}}})
    assert caught.value.param == "text"
