"""JSON mode and function calling end to end: the official openai and cloudflare SDKs against the
real gateway and two real SmolLM2 backends. Every answer the grammar finished must parse and
validate; each request is billed once."""

from __future__ import annotations

import json
from typing import Any

import cloudflare
import httpx
import jsonschema
import openai
import pytest

from gateway.fleet.catalog import DEFAULT_MODEL_ID
from tests.gateway.fixtures_e2e import InProcessGateway

pytestmark = pytest.mark.slow

ACCOUNT = "acc-json"
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "country": {"type": "string", "maxLength": 24},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["city", "country", "population_millions"],
}
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    },
}
ASK_CITY: Any = [{"role": "user", "content": "Describe Paris as JSON: city, country, population in millions."}]
ASK_WEATHER: Any = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def key(gateway: InProcessGateway) -> str:
    return gateway.new_key("t-json", ACCOUNT)


@pytest.fixture(scope="module")
def oai(gateway: InProcessGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{gateway.url}/client/v4/accounts/{ACCOUNT}/ai/v1", max_retries=0)


@pytest.fixture(scope="module")
def cf(gateway: InProcessGateway, key: str) -> cloudflare.Cloudflare:
    return cloudflare.Cloudflare(api_token=key, base_url=f"{gateway.url}/client/v4", max_retries=0)


def test_openai_sdk_json_schema_answer_validates_and_is_billed_once(oai: openai.OpenAI, gateway: InProcessGateway) -> None:
    raw = oai.chat.completions.with_raw_response.create(
        model=DEFAULT_MODEL_ID,
        messages=ASK_CITY,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}},
    )
    answer = raw.parse()
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), CITY)
    record = gateway.ledger_record(raw.headers["cf-ray"])
    assert (record.completion_tokens, record.status) == (answer.usage.completion_tokens, "ok")


def test_openai_sdk_streamed_json_object_parses(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=ASK_CITY, max_tokens=48, temperature=0, stream=True,
        response_format={"type": "json_object"},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    if finish == ["stop"]:
        assert isinstance(json.loads(text), dict)
    else:  # cut by max_tokens: said so, and what came is the start of an object
        assert finish == ["length"] and text.startswith("{")


def test_max_tokens_cuts_json_with_finish_reason_length(oai: openai.OpenAI, gateway: InProcessGateway, key: str) -> None:
    answer = oai.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=ASK_CITY, max_tokens=3, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}},
    )
    assert answer.choices[0].finish_reason == "length"
    assert (answer.choices[0].message.content or "").startswith("{")


def test_openai_sdk_required_tool_call(oai: openai.OpenAI) -> None:
    answer = oai.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=ASK_WEATHER, max_tokens=40, temperature=0,
        tools=[{"type": "function", "function": WEATHER}], tool_choice="required",
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["parameters"])


def test_openai_sdk_streamed_named_tool_call_then_the_next_turn(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=ASK_WEATHER, max_tokens=40, temperature=0, stream=True,
        tools=[{"type": "function", "function": WEATHER}],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in stream:
        for delta_call in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            call = calls.setdefault(delta_call.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta_call.id or ""
            call["name"] += delta_call.function.name or "" if delta_call.function else ""
            call["arguments"] += delta_call.function.arguments or "" if delta_call.function else ""
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "tool_calls" and list(calls) == [0] and calls[0]["name"] == "get_weather"
    arguments = json.loads(calls[0]["arguments"])
    jsonschema.validate(arguments, WEATHER["parameters"])
    follow_up: Any = [
        *ASK_WEATHER,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": calls[0]["id"], "type": "function", "function": {"name": "get_weather", "arguments": calls[0]["arguments"]}}
        ]},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": '{"temperature": 4, "sky": "snow"}'},
    ]
    answer = oai.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=follow_up, max_tokens=24, temperature=0, tools=[{"type": "function", "function": WEATHER}]
    )
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    for call in choice.message.tool_calls or []:  # auto: text or a call, and a call is always valid
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["parameters"])
    assert choice.message.content or choice.message.tool_calls


def test_cloudflare_sdk_json_schema_returns_an_object(cf: cloudflare.Cloudflare) -> None:
    result: Any = cf.ai.run(
        DEFAULT_MODEL_ID, account_id=ACCOUNT, messages=ASK_CITY, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": CITY},
    )
    response = result["response"] if isinstance(result, dict) else result.response
    assert isinstance(response, dict)
    jsonschema.validate(response, CITY)


def test_cloudflare_sdk_tool_call_in_the_workers_ai_shape(cf: cloudflare.Cloudflare) -> None:
    result: Any = cf.ai.run(
        DEFAULT_MODEL_ID, account_id=ACCOUNT, messages=ASK_WEATHER, max_tokens=40, temperature=0,
        tools=[WEATHER], extra_body={"tool_choice": "required"},
    )
    tool_calls = result["tool_calls"] if isinstance(result, dict) else result.tool_calls
    (call,) = tool_calls
    call = call if isinstance(call, dict) else call.model_dump()
    assert call["name"] == "get_weather"
    jsonschema.validate(call["arguments"], WEATHER["parameters"])


def test_workers_ai_stream_sends_the_calls_before_the_usage(gateway: InProcessGateway, key: str) -> None:
    url = f"{gateway.url}/client/v4/accounts/{ACCOUNT}/ai/run/{DEFAULT_MODEL_ID}"
    body = {"messages": ASK_WEATHER, "max_tokens": 40, "temperature": 0, "stream": True,
            "tools": [WEATHER], "tool_choice": "required"}
    with httpx.stream("POST", url, json=body, headers={"authorization": f"Bearer {key}"}, timeout=120) as response:
        assert response.status_code == 200
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    payloads = [json.loads(e) for e in events[:-1]]
    calls = [p["tool_calls"] for p in payloads if "tool_calls" in p]
    assert len(calls) == 1 and "usage" in payloads[-1] and "tool_calls" in payloads[-2]
    (call,) = calls[0]
    assert call["name"] == "get_weather"
    jsonschema.validate(call["arguments"], WEATHER["parameters"])


def test_a_schema_the_backend_cannot_compile_is_a_400_naming_it(oai: openai.OpenAI) -> None:
    broken = {"type": "object", "properties": {"a": {"$ref": "#/definitions/nowhere"}}}
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(
            model=DEFAULT_MODEL_ID, messages=ASK_CITY, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "broken", "schema": broken}},
        )
    assert "json schema cannot be compiled" in str(caught.value.body)


def test_responses_api_text_format_json_schema(oai: openai.OpenAI) -> None:
    response = oai.responses.create(
        model=DEFAULT_MODEL_ID, input=ASK_CITY[0]["content"], max_output_tokens=40, temperature=0,
        text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}},
    )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), CITY)
    assert response.text is not None and response.text.format is not None and response.text.format.type == "json_schema"


def test_completions_json_object_on_a_raw_prompt(oai: openai.OpenAI) -> None:
    answer = oai.completions.create(
        model=DEFAULT_MODEL_ID, prompt="A JSON object describing Paris:", max_tokens=32, temperature=0,
        extra_body={"response_format": {"type": "json_object"}},
    )
    text, finish = answer.choices[0].text, answer.choices[0].finish_reason
    assert text.startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
