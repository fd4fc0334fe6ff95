"""Request validation: defaults, ranges and messages that name the field."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidInput
from gateway.pipeline.schemas import (
    Prompt,
    Sampling,
    parse_chat_completions,
    parse_completions,
    parse_responses,
    parse_workers_ai,
)


def test_workers_ai_defaults_follow_the_documented_schema() -> None:
    inp = parse_workers_ai({"prompt": "hi"})
    assert inp.sampling == Sampling(max_tokens=256, temperature=0.6, top_p=1.0, top_k=None, seed=None)
    assert inp.stream is False
    # a prompt without raw goes through the chat template as one user message
    assert inp.prompt == Prompt(messages=({"role": "user", "content": "hi"},))


def test_raw_prompt_skips_the_template() -> None:
    assert parse_workers_ai({"prompt": "<|im_start|>x", "raw": True}).prompt == Prompt(text="<|im_start|>x")


def test_messages_are_kept_in_order() -> None:
    inp = parse_workers_ai({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]})
    assert inp.prompt.messages == ({"role": "system", "content": "s"}, {"role": "user", "content": "u"})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "prompt"),
        ({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x" * 131073}, "prompt"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "raw": True}, "raw"),
        ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "x", "max_tokens": "10"}, "max_tokens"),
        ({"prompt": "x", "max_tokens": 1.5}, "max_tokens"),
        ({"prompt": "x", "temperature": 5.01}, "temperature"),
        ({"prompt": "x", "temperature": -0.1}, "temperature"),
        ({"prompt": "x", "temperature": True}, "temperature"),
        ({"prompt": "x", "top_p": 0.0005}, "top_p"),
        ({"prompt": "x", "top_p": 1.01}, "top_p"),
        ({"prompt": "x", "top_k": 0}, "top_k"),
        ({"prompt": "x", "top_k": 51}, "top_k"),
        ({"prompt": "x", "seed": 0}, "seed"),
        ({"prompt": "x", "seed": 10_000_000_000}, "seed"),
        ({"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
        ({"prompt": "x", "repetition_penalty": 2.5}, "repetition_penalty"),
        ({"prompt": "x", "frequency_penalty": -2.1}, "frequency_penalty"),
        ({"prompt": "x", "presence_penalty": 2.1}, "presence_penalty"),
        ({"prompt": "x", "stream": "yes"}, "stream"),
        ({"prompt": "x", "raw": 1}, "raw"),
    ],
)
def test_bad_workers_ai_input_names_the_field(body: dict, field: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_workers_ai(body)
    assert caught.value.param == field
    assert field in caught.value.message
    assert caught.value.code == 5004 and caught.value.status == 400


def test_edges_of_every_range_are_accepted() -> None:
    inp = parse_workers_ai(
        {
            "prompt": "x",
            "max_tokens": 1,
            "temperature": 5,
            "top_p": 0.001,
            "top_k": 50,
            "seed": 9_999_999_999,
            "repetition_penalty": 2,
            "frequency_penalty": -2,
            "presence_penalty": 2,
            "stream": True,
        }
    )
    assert inp.sampling == Sampling(1, 5.0, 0.001, 50, 9_999_999_999, 2.0, -2.0, 2.0)
    assert inp.stream


def test_backend_fields_leave_out_what_was_not_set() -> None:
    fields = parse_workers_ai({"prompt": "x"}).sampling.backend_fields()
    assert "top_k" not in fields and "seed" not in fields and "stop" not in fields
    assert fields["temperature"] == 0.6 and isinstance(fields["temperature"], float)
    fields = parse_workers_ai({"prompt": "x", "top_k": 3, "seed": 7, "temperature": 1}).sampling.backend_fields()
    assert (fields["top_k"], fields["seed"], fields["temperature"]) == (3, 7, 1.0)


def test_openai_chat_uses_openai_names_and_ranges() -> None:
    inp = parse_chat_completions(
        {
            "model": "m",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
            "max_completion_tokens": 9,
            "stop": "END",
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    assert inp.prompt.messages == ({"role": "user", "content": "ab"},)
    assert (inp.sampling.max_tokens, inp.sampling.stop, inp.stream, inp.include_usage) == (9, ("END",), True, True)
    with pytest.raises(InvalidInput) as caught:
        parse_chat_completions({"model": "m", "messages": [{"role": "user", "content": "a"}], "temperature": 2.5})
    assert caught.value.param == "temperature"
    with pytest.raises(InvalidInput) as caught:
        parse_chat_completions({"model": "m", "messages": [{"role": "user", "content": "a"}], "n": 2})
    assert caught.value.param == "n"


def test_openai_completions_take_raw_text() -> None:
    assert parse_completions({"model": "m", "prompt": ["once upon"]}).prompt == Prompt(text="once upon")
    with pytest.raises(InvalidInput):
        parse_completions({"model": "m", "prompt": ["a", "b"]})


# ---- the Responses API --------------------------------------------------------------------------


def test_responses_input_string_and_instructions_become_chat_messages() -> None:
    parsed = parse_responses({"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 9})
    assert parsed.generation.prompt.messages == ({"role": "system", "content": "Be brief."},
                                                 {"role": "user", "content": "Hi"})
    assert parsed.generation.sampling.max_tokens == 9 and parsed.max_output_tokens == 9
    assert parsed.obfuscate and not parsed.generation.stream


def test_responses_message_items_take_text_parts_and_earlier_answers() -> None:
    parsed = parse_responses({"model": "m", "temperature": 0, "stream": True,
                              "stream_options": {"include_obfuscation": False}, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "2+2?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]},
        {"role": "developer", "content": "x"},
    ]})
    assert parsed.generation.prompt.messages == ({"role": "user", "content": "2+2?"},
                                                 {"role": "assistant", "content": "4"},
                                                 {"role": "developer", "content": "x"})
    assert parsed.generation.sampling.temperature == 0 and parsed.generation.stream and not parsed.obfuscate


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "function tools only"),
        ({"input": "x", "tools": [{"type": "function", "name": "f"}], "text": {"format": {"type": "json_object"}}},
         "tools", "either tools or text.format"),
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id", "stores no responses"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}, "text", "needs a name"),
        ({"input": "x", "text": {"verbosity": "low"}}, "text", "verbosity"),
        ({"input": "x", "max_token": 3}, "max_token", "not a field"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input", "function_call_output items"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]}, "input", "text only"),
        ({"input": []}, "input", "non-empty"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "out of range"),
    ],
)
def test_responses_refuse_what_they_would_ignore_by_name(body: dict, param: str, words: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        parse_responses({"model": "m", **body})
    assert caught.value.param == param and words in caught.value.message


def test_responses_text_format_is_json_mode() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    parsed = parse_responses({"model": "m", "input": "x", "text": {"format": fmt}})
    assert parsed.generation.response_format == {"type": "json_schema", "json_schema": {"name": "thing", "schema": schema}}
    assert parsed.text_format == fmt
    assert parse_responses({"model": "m", "input": "x", "text": {"format": {"type": "json_object"}}}).generation.response_format \
        == {"type": "json_object"}


def test_responses_function_calls_of_a_turn_become_one_assistant_message_then_tool_results() -> None:
    parsed = parse_responses({"model": "m", "tools": [{"type": "function", "name": "f", "parameters": {}}], "input": [
        {"role": "user", "content": "weather in Oslo and Rome?"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "3 C"},
        {"type": "function_call_output", "call_id": "c2", "output": "18 C"},
    ]})
    messages = parsed.generation.prompt.messages
    assert messages is not None and [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["content"] == ('{"name": "f", "arguments": {"city": "Oslo"}}\n'
                                      '{"name": "f", "arguments": {"city": "Rome"}}')
    assert parsed.generation.tools is not None and parsed.generation.tools.mode == "auto"


def test_responses_no_op_values_pass() -> None:
    parse_responses({"model": "m", "input": "x", "tools": [], "tool_choice": "auto", "store": True,
                     "text": {"format": {"type": "text"}}, "truncation": "disabled", "metadata": {"a": "b"}})


BOMB = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 2**64}}}
ASK = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("parse", "body", "param", "path"),
    [
        (parse_workers_ai, {"prompt": "x", "guided_json": BOMB}, "guided_json", "guided_json"),
        (parse_workers_ai, {"prompt": "x", "response_format": {"type": "json_schema", "json_schema": BOMB}},
         "response_format", "response_format.json_schema"),
        (parse_chat_completions, {"messages": ASK, "response_format": {
            "type": "json_schema", "json_schema": {"name": "b", "schema": BOMB}}},
         "response_format", "response_format.json_schema.schema"),
        (parse_responses, {"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "b", "schema": BOMB}}},
         "text", "text.format.schema"),
        (parse_workers_ai, {"messages": ASK, "tools": [{"name": "f", "parameters": BOMB}], "tool_choice": "required"},
         "tools", "tools[0].parameters"),
        (parse_chat_completions, {"messages": ASK, "tools": [{"type": "function", "function": {"name": "f", "parameters": BOMB}}]},
         "tools", "tools[0].function.parameters"),
        (parse_responses, {"model": "m", "input": "x", "tools": [{"type": "function", "name": "f", "parameters": BOMB}]},
         "tools", "tools[0].parameters"),
    ],
)
def test_a_schema_integer_past_64_bits_is_refused_at_every_entry_naming_its_path(
    parse: Any, body: dict[str, Any], param: str, path: str
) -> None:
    """No backend can compile it: the gateway refuses it before forwarding (the built-in backend answered 500)."""
    with pytest.raises(InvalidInput) as caught:
        parse(body)
    assert caught.value.param == param
    assert caught.value.message.startswith(f"{path}.properties.n.minimum is 18446744073709551616, outside the 64-bit")
