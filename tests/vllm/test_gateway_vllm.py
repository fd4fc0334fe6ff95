"""The gateway in front of a real vLLM (tests/vllm/fixtures.py): what a user sees through the
Workers AI and OpenAI routes, what the ledger records, and what vLLM itself counts.

vLLM serves the shipped SmolLM2 exported as a Hugging Face checkpoint; greedy answers must be the
built-in engine's own (the export and the gateway's tokenizing are right). Cached tokens are read
three ways and must agree: the answer's usage, the ledger record, and vLLM's
`vllm:prefix_cache_hits_total` counter. Every prompt that tests caching starts with a fresh
marker, since the session's vLLM keeps its cache from test to test.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from cli.processes import ChildProcess
from contracts.usage import Usage
from engines.builtin.config import EngineConfig
from engines.builtin.runner.model_runner import ForwardItem, ModelRunner
from gateway.billing.prices import default_prices
from gateway.store.models import UsageRecord
from policies.prefix import block_hashes
from policies.pricing import Price, cost_micros
from tests.gateway.e2e.test_structured_e2e import ASK_CITY, ASK_WEATHER, CITY, WEATHER
from tests.gateway.fixtures_e2e import InProcessGateway, gateway_settings, running_child
from tests.gateway.store.calls import match_prefix
from tests.vllm.fixtures import VLLM_API_KEY, VLLM_BACKEND_ID, VLLM_MODEL_ID, vllm_model_spec
from tests.vllm.server import BLOCK_SIZE, VllmProcess

pytestmark = pytest.mark.slow

ACCOUNT = "acc-vllm"
# About 600 tokens: several KV blocks, so a second sending has a hit vLLM can count
LONG_CONTEXT = " ".join(f"Fact {i}: the {i}th lighthouse on the northern coast is painted red and white." for i in range(40))


@pytest.fixture(scope="module")
def key(vllm_gateway: InProcessGateway) -> str:
    return vllm_gateway.new_key("t-vllm", ACCOUNT)


@pytest.fixture(scope="module")
def oai(vllm_gateway: InProcessGateway, key: str) -> openai.OpenAI:
    return openai.OpenAI(api_key=key, base_url=f"{vllm_gateway.url}/client/v4/accounts/{ACCOUNT}/ai/v1", max_retries=0)


def run(gw: InProcessGateway, key: str, body: dict[str, Any], account: str = ACCOUNT) -> httpx.Response:
    url = f"{gw.url}/client/v4/accounts/{account}/ai/run/{VLLM_MODEL_ID}"
    return httpx.post(url, json=body, headers={"authorization": f"Bearer {key}"}, timeout=180)


def sse_payloads(text: str) -> list[Any]:
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def tenant_records(gw: InProcessGateway, tenant_id: str) -> list[UsageRecord]:
    assert gw.store is not None
    store = gw.store

    async def collect() -> list[UsageRecord]:
        return [r async for r in store.ledger.iter_usage(0, time.time() + 3600, tenant_id)]

    return gw.call(collect())


def eventually(check: Callable[[], bool], timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def price() -> Price:
    return Price.from_config(VLLM_MODEL_ID, default_prices()[VLLM_MODEL_ID])


# ---- answers ----------------------------------------------------------------------------------


def builtin_greedy(messages: list[dict[str, str]], num_new: int) -> tuple[list[int], str]:
    """The built-in engine's exact model (deterministic mode): the prompt's ids and its greedy answer."""
    runner = ModelRunner(EngineConfig(model="smollm2", mode="deterministic", num_kv_blocks=16))
    tokenizer = runner.tokenizer
    prompt = tokenizer.encode(tokenizer.apply_chat_template(messages))
    table = list(range(-(-(len(prompt) + num_new) // runner.block_size)))
    logits = runner.execute([ForwardItem(prompt, 0, table)])
    out: list[int] = []
    while len(out) < num_new and (token := int(logits[0].argmax())) not in tokenizer.eos_token_ids:
        out.append(token)
        logits = runner.execute([ForwardItem([token], len(prompt) + len(out) - 1, table)])
    return prompt, tokenizer.decode(out)


def test_workers_ai_answers_as_the_builtin_engine_does_and_is_billed_once(
    vllm_gateway: InProcessGateway, key: str
) -> None:
    messages = [{"role": "user", "content": "Name three colours of the rainbow."}]
    prompt, expected = builtin_greedy(messages, 12)
    answer = run(vllm_gateway, key, {"messages": messages, "max_tokens": 12, "temperature": 0})
    assert answer.status_code == 200, answer.text
    result = answer.json()["result"]
    assert result["response"] == expected
    assert result["usage"]["prompt_tokens"] == len(prompt)
    streamed = run(vllm_gateway, key, {"messages": messages, "max_tokens": 12, "temperature": 0, "stream": True})
    events = sse_payloads(streamed.text)
    assert events[-1] == "[DONE]" and "".join(e.get("response", "") for e in events[:-2]) == expected
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == result["usage"]["completion_tokens"] > 0
    for response, counted in ((answer, result["usage"]), (streamed, usage)):
        record = vllm_gateway.ledger_record(response.headers["cf-ray"])
        assert (record.status, record.backend_id) == ("ok", VLLM_BACKEND_ID)
        assert (record.prompt_tokens, record.completion_tokens) == (counted["prompt_tokens"], counted["completion_tokens"])


def test_openai_chat_and_completions_routes_stream_and_not(oai: openai.OpenAI) -> None:
    chat = oai.chat.completions.create(model=VLLM_MODEL_ID, messages=ASK_CITY, max_tokens=10, temperature=0)
    assert chat.choices[0].message.content and chat.usage is not None and chat.usage.completion_tokens <= 10
    stream = oai.chat.completions.create(
        model=VLLM_MODEL_ID, messages=ASK_CITY, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == chat.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    completion = oai.completions.create(model=VLLM_MODEL_ID, prompt="The capital of France is", max_tokens=6, temperature=0)
    assert completion.choices[0].text and completion.usage is not None and completion.usage.completion_tokens <= 6


# ---- JSON mode and tools: the gateway's response_format, enforced by vLLM's structured outputs --


def test_json_schema_answers_validate_on_both_routes(oai: openai.OpenAI, vllm_gateway: InProcessGateway, key: str) -> None:
    chat = oai.chat.completions.create(
        model=VLLM_MODEL_ID, messages=ASK_CITY, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}},
    )
    assert chat.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(chat.choices[0].message.content or ""), CITY)
    answer = run(vllm_gateway, key, {"messages": ASK_CITY, "max_tokens": 40, "temperature": 0,
                                     "response_format": {"type": "json_schema", "json_schema": CITY}})
    assert answer.status_code == 200, answer.text
    jsonschema.validate(answer.json()["result"]["response"], CITY)  # parsed: an object, not text


def test_json_object_mode_gives_an_object(oai: openai.OpenAI) -> None:
    chat = oai.chat.completions.create(
        model=VLLM_MODEL_ID, messages=ASK_CITY, max_tokens=60, temperature=0, response_format={"type": "json_object"}
    )
    text = chat.choices[0].message.content or ""
    if chat.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # cut by max_tokens: said so, and what came is the start of an object
        assert chat.choices[0].finish_reason == "length" and text.lstrip().startswith("{")


def test_required_and_auto_tool_calls_are_valid(oai: openai.OpenAI) -> None:
    tools: Any = [{"type": "function", "function": WEATHER}]
    required = oai.chat.completions.create(
        model=VLLM_MODEL_ID, messages=ASK_WEATHER, max_tokens=40, temperature=0, tools=tools, tool_choice="required"
    )
    choice = required.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["parameters"])
    auto = oai.chat.completions.create(model=VLLM_MODEL_ID, messages=ASK_WEATHER, max_tokens=40, temperature=0, tools=tools)
    assert auto.choices[0].message.content or auto.choices[0].message.tool_calls
    for made in auto.choices[0].message.tool_calls or []:  # auto: text or a call, and a call is always valid
        jsonschema.validate(json.loads(made.function.arguments), WEATHER["parameters"])


# ---- cached tokens: vLLM's count, in the answer and the ledger, billed at the discount -----------


def test_cached_tokens_are_vllms_own_count_and_billed_at_the_discount(
    vllm_gateway: InProcessGateway, vllm_server: VllmProcess, key: str
) -> None:
    body = {"prompt": f"{uuid.uuid4().hex} {LONG_CONTEXT} How many lighthouses are there?", "max_tokens": 4, "temperature": 0}
    first = run(vllm_gateway, key, body)
    assert first.status_code == 200, first.text
    hits_before = vllm_server.metric("vllm:prefix_cache_hits_total")
    second = run(vllm_gateway, key, body)
    usage = second.json()["result"]["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert first.json()["result"]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage["prompt_tokens"] > 500 and cached >= usage["prompt_tokens"] - 2 * BLOCK_SIZE and cached % BLOCK_SIZE == 0
    assert eventually(lambda: vllm_server.metric("vllm:prefix_cache_hits_total") - hits_before == cached)
    record = vllm_gateway.ledger_record(second.headers["cf-ray"])
    assert (record.prompt_tokens, record.cached_tokens) == (usage["prompt_tokens"], cached)
    discounted = cost_micros(Usage(record.prompt_tokens, record.completion_tokens, record.cached_tokens), price())
    full = cost_micros(Usage(record.prompt_tokens, record.completion_tokens), price())
    assert record.cost_micro == discounted < full


def test_streamed_cached_tokens_match_the_ledger(vllm_gateway: InProcessGateway, key: str) -> None:
    body = {"prompt": f"{uuid.uuid4().hex} {LONG_CONTEXT} Which lighthouse is last?", "max_tokens": 4, "stream": True}
    run(vllm_gateway, key, body)
    second = run(vllm_gateway, key, body)
    usage = sse_payloads(second.text)[-2]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 2 * BLOCK_SIZE
    record = vllm_gateway.ledger_record(second.headers["cf-ray"])
    assert record.cached_tokens == usage["prompt_tokens_details"]["cached_tokens"]


def indexed_tokens(gw: InProcessGateway, tenant_id: str, text: str, backend_id: str = VLLM_BACKEND_ID) -> int:
    """How many leading tokens of the raw prompt `text` the gateway's prefix index places on the vLLM
    backend `backend_id` for `tenant_id` (fed by vLLM's KV events, re-hashed under the tenant's salt)."""
    services = gw.services
    model = services.catalog.get(VLLM_MODEL_ID)

    async def lookup() -> int:
        tokenizer = await services.generator.tokenizer(model)
        salt = await services.generator.router.salts.salt(tenant_id)
        hashes = block_hashes(tokenizer.encode_text(text, is_raw=True), model.block_size, salt)
        return (await match_prefix(services.store, hashes)).get(backend_id, 0) * model.block_size

    return gw.call(lookup())


def test_tenants_never_hit_each_others_cache(vllm_gateway: InProcessGateway) -> None:
    """The gateway's `cache_salt` (an HMAC of the tenant) keeps vLLM's prefix cache per tenant, and
    the prefix index that vLLM's KV events feed keeps them apart too."""
    key_a = vllm_gateway.new_key("t-vllm-a", "acc-vllm-a")
    key_b = vllm_gateway.new_key("t-vllm-b", "acc-vllm-b")
    text = f"{uuid.uuid4().hex} {LONG_CONTEXT} Who paints them?"
    body = {"prompt": text, "raw": True, "max_tokens": 2, "temperature": 0}

    def cached(key: str, account: str) -> int:
        answer = run(vllm_gateway, key, body, account)
        assert answer.status_code == 200, answer.text
        record = vllm_gateway.ledger_record(answer.headers["cf-ray"])
        counted: int = answer.json()["result"]["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert record.cached_tokens == counted
        return counted

    assert cached(key_a, "acc-vllm-a") == 0
    assert eventually(lambda: indexed_tokens(vllm_gateway, "t-vllm-a", text) > 500)  # vLLM said it stored them
    assert indexed_tokens(vllm_gateway, "t-vllm-b", text) == 0
    assert cached(key_b, "acc-vllm-b") == 0  # the same prompt, in the cache, but tenant A's
    hit = cached(key_a, "acc-vllm-a")  # A's own hit
    assert hit > 500 and indexed_tokens(vllm_gateway, "t-vllm-a", text) >= hit - BLOCK_SIZE


# ---- streams that end early ---------------------------------------------------------------------


def test_a_client_that_leaves_mid_stream_stops_the_generation_on_vllm(
    vllm_gateway: InProcessGateway, vllm_server: VllmProcess
) -> None:
    key = vllm_gateway.new_key("t-vllm-leave", "acc-vllm-leave")
    generated_before = vllm_server.metric("vllm:generation_tokens_total")
    body = {"prompt": "Count from 1 to 1000, one number per line.", "max_tokens": 2000, "temperature": 0, "stream": True}
    url = f"{vllm_gateway.url}/client/v4/accounts/acc-vllm-leave/ai/run/{VLLM_MODEL_ID}"
    with httpx.stream("POST", url, json=body, headers={"authorization": f"Bearer {key}"}, timeout=120) as response:
        assert response.status_code == 200
        num_events = 0
        for line in response.iter_lines():
            num_events += line.startswith("data: ")
            if num_events == 5:
                break  # and leave
        request_id = response.headers["cf-ray"]
    # vLLM names the request by the gateway's x-request-id; a client-side abort is not counted in
    # its metrics (vllm:request_success_total stays as it was), but its log says so
    assert eventually(lambda: f"Request cmpl-{request_id}-0 aborted." in vllm_server.log()), vllm_server.log_tail()
    assert eventually(lambda: vllm_server.metric("vllm:num_requests_running") == 0)
    generated = vllm_server.metric("vllm:generation_tokens_total") - generated_before
    time.sleep(1.0)
    assert vllm_server.metric("vllm:generation_tokens_total") - generated_before == generated < 1000  # it stopped
    record = vllm_gateway.ledger_record(request_id)
    assert record.status == "cancelled" and 4 <= record.completion_tokens <= generated
    assert len(tenant_records(vllm_gateway, "t-vllm-leave")) == 1


@pytest.fixture
def vllm_link(vllm_server: VllmProcess) -> Iterator[ChildProcess]:
    """The session's vLLM reached through a TCP forwarder running as a process of its own
    (tests/gateway/fault_proxy.py), for a test that kills it: to the gateway that is vLLM dying mid-stream
    (its connection drops), without a second vLLM start (about 1 to 1.5 minutes on 2 cores)."""
    upstream = f"127.0.0.1:{vllm_server.port}"
    with running_child(
        "vllm link",
        lambda port: [sys.executable, "-m", "tests.gateway.fault_proxy", "--listen-port", str(port), "--upstream", upstream],
        timeout_s=30,
    ) as link:
        yield link


def test_vllm_gone_mid_stream_gives_an_error_event_and_one_ledger_record(
    vllm_link: ChildProcess, vllm_server: VllmProcess, vllm_checkpoint: Path, tmp_path: Path
) -> None:
    backend = {"id": "vllm-linked", "base_url": vllm_link.url, "models": [VLLM_MODEL_ID], "kind": "vllm"}
    settings = gateway_settings(
        tmp_path, [backend], models=[vllm_model_spec(vllm_checkpoint)], backend_api_key=VLLM_API_KEY, health_interval_s=0.5
    )
    gw = InProcessGateway(settings).start()
    with contextlib.ExitStack() as stack:
        stack.callback(gw.stop)
        key = gw.new_key("t-vllm-gone", "acc-gone")
        body = {"prompt": "Count from 1 to 1000, one number per line.", "max_tokens": 2000, "temperature": 0, "stream": True}
        url = f"{gw.url}/client/v4/accounts/acc-gone/ai/run/{VLLM_MODEL_ID}"
        events: list[str] = []
        with httpx.stream("POST", url, json=body, headers={"authorization": f"Bearer {key}"}, timeout=120) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    if len(events) == 5:
                        vllm_link.kill()
            request_id = response.headers["cf-ray"]
        payloads = [json.loads(e) for e in events if e != "[DONE]"]
        assert events[-1] != "[DONE]" and payloads[-1]["errors"][0]["code"] == 3043, events[-3:]
        texts = [p for p in payloads if p.get("response")]
        record = gw.ledger_record(request_id)
        assert record.status == "backend_error" and record.completion_tokens >= len(texts) >= 5
        assert len(tenant_records(gw, "t-vllm-gone")) == 1
        # and vLLM, whose peer is gone, stops generating too
        assert eventually(lambda: f"Request cmpl-{request_id}-0 aborted." in vllm_server.log()), vllm_server.log_tail()
