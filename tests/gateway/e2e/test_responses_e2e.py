"""`/ai/v1/responses` through the official openai SDK against a real gateway and backends."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from gateway.fleet.catalog import DEFAULT_MODEL_ID
from tests.gateway.fixtures_e2e import InProcessGateway

pytestmark = pytest.mark.slow

STREAM_EVENTS = [
    "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
    "response.output_text.done", "response.content_part.done", "response.output_item.done",
]


@pytest.fixture(scope="module")
def oai(gateway: InProcessGateway) -> openai.OpenAI:
    key = gateway.new_key("t-responses", "acc-responses")
    return openai.OpenAI(api_key=key, base_url=f"{gateway.url}/client/v4/accounts/acc-responses/ai/v1", max_retries=0)


def request_id(response_id: str) -> str:
    return response_id.removeprefix("resp_")


def test_a_whole_response_answers_text_with_usage_and_is_billed_once(oai: openai.OpenAI, gateway: InProcessGateway) -> None:
    response = oai.responses.create(
        model=DEFAULT_MODEL_ID, input="Name a colour.", instructions="Answer in one word.", max_output_tokens=6,
    )
    assert response.object == "response" and response.model == DEFAULT_MODEL_ID
    assert response.status in ("completed", "incomplete") and response.output_text
    [item] = response.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    usage = response.usage
    assert usage is not None and 0 < usage.output_tokens <= 6 and usage.input_tokens > 0
    assert usage.input_tokens_details.cached_tokens >= 0 and usage.total_tokens == usage.input_tokens + usage.output_tokens
    record = gateway.ledger_record(request_id(response.id))
    assert (record.prompt_tokens, record.completion_tokens) == (usage.input_tokens, usage.output_tokens)
    assert record.status == "ok"


def test_a_stream_sends_the_documented_events_in_order(oai: openai.OpenAI, gateway: InProcessGateway) -> None:
    events: list[Any] = list(oai.responses.create(
        model=DEFAULT_MODEL_ID, input="Count: one, two,", max_output_tokens=8, temperature=0, stream=True,
    ))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert deltas and kinds == STREAM_EVENTS[:4] + ["response.output_text.delta"] * len(deltas) + STREAM_EVENTS[4:] + [
        kinds[-1]]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(d.delta for d in deltas)
    assert all(d.obfuscation for d in deltas)  # padding against token-length side channels, OpenAI's default
    final = events[-1].response
    assert events[-4].text == text and final.output_text == text and final.id == events[0].response.id
    assert events[0].response.status == "in_progress" and final.status == kinds[-1].removeprefix("response.")
    assert final.usage is not None and final.usage.output_tokens <= 8
    record = gateway.ledger_record(request_id(final.id))
    assert record.completion_tokens == final.usage.output_tokens and record.status == "ok"


def test_message_items_are_the_prompt_chat_completions_would_build(oai: openai.OpenAI) -> None:
    turns: Any = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say hello."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Again, louder."},
    ]
    items: Any = [
        {"role": "user", "content": [{"type": "input_text", "text": "Say hello."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]},
        {"role": "user", "content": "Again, louder."},
    ]
    chat = oai.chat.completions.create(model=DEFAULT_MODEL_ID, messages=turns, max_tokens=8, temperature=0)
    response = oai.responses.create(
        model=DEFAULT_MODEL_ID, instructions="You are terse.", input=items, max_output_tokens=8, temperature=0,
    )
    # the same prompt to the token (the answers may differ in the last digits: the backends run the fast
    # mode, exact only to a tolerance between a whole prefill and one after a prefix hit)
    assert response.output_text and chat.choices[0].message.content
    assert response.usage is not None and chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens


def test_text_format_json_schema_constrains_the_answer(oai: openai.OpenAI) -> None:
    colour = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "warm": {"type": "boolean"}},
              "required": ["name", "warm"], "additionalProperties": False}
    response = oai.responses.create(
        model=DEFAULT_MODEL_ID, input="Describe red as JSON.", max_output_tokens=40, temperature=0,
        text={"format": {"type": "json_schema", "name": "colour", "schema": colour, "strict": True}},
    )
    assert response.status == "completed", response.output_text
    jsonschema.validate(json.loads(response.output_text), colour)
    assert response.text is not None and response.text.format.type == "json_schema"


def test_a_response_cut_by_max_output_tokens_is_incomplete(oai: openai.OpenAI) -> None:
    response = oai.responses.create(model=DEFAULT_MODEL_ID, input="Write a long story.", max_output_tokens=1)
    assert response.status == "incomplete" and response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.output_tokens == 1


def test_what_responses_would_ignore_is_refused_by_name(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model=DEFAULT_MODEL_ID, input="x", previous_response_id="resp_earlier")
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        oai.responses.create(model=DEFAULT_MODEL_ID, input="x", tools=[{"type": "web_search"}])
    assert caught.value.body["param"] == "tools"  # type: ignore[index]


WEATHER: Any = {"type": "function", "name": "get_weather", "description": "The weather in a city now.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                               "required": ["city"], "additionalProperties": False}}


def test_a_required_function_call_comes_back_as_a_function_call_item_whole_and_streamed(oai: openai.OpenAI) -> None:
    ask: Any = dict(model=DEFAULT_MODEL_ID, input="What is the weather in Oslo?", tools=[WEATHER],
                    tool_choice="required", max_output_tokens=40, temperature=0)
    response = oai.responses.create(**ask)
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    events: list[Any] = list(oai.responses.create(**ask, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1  # each stream is checked on its own: the fast mode may differ after a prefix hit
    jsonschema.validate(json.loads(done[0].arguments), WEATHER["parameters"])
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final_calls = [item for item in events[-1].response.output if item.type == "function_call"]
    assert [c.arguments for c in final_calls] == [done[0].arguments]


def test_a_function_result_is_read_in_the_next_turn(oai: openai.OpenAI) -> None:
    response = oai.responses.create(
        model=DEFAULT_MODEL_ID, tools=[WEATHER], tool_choice="none", max_output_tokens=12, temperature=0,
        input=[{"role": "user", "content": "What is the weather in Oslo?"},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
               {"type": "function_call_output", "call_id": "call_1", "output": "Snow, -3 C"}],
    )
    assert response.output_text and not [item for item in response.output if item.type == "function_call"]
    assert response.usage is not None and response.usage.input_tokens > 20


def test_the_sdk_stream_helper_assembles_the_same_response(oai: openai.OpenAI) -> None:
    """`client.responses.stream` accumulates the events itself: they must be coherent (items, indexes).
    Its get_final_response() wants response.completed; a cut answer ends with response.incomplete,
    as OpenAI's does."""
    ask: Any = dict(model=DEFAULT_MODEL_ID, input="Reply with one word: hello.", temperature=0)
    for budget in (48, 2):
        with oai.responses.stream(**ask, max_output_tokens=budget) as stream:
            events = list(stream)
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            last = events[-1]
            assert last.response.output_text == deltas and last.response.usage is not None
            if budget == 2:
                assert last.type == "response.incomplete"
            if last.type == "response.completed":
                assert stream.get_final_response().output_text == deltas
