"""End to end: Workers AI and OpenAI requests through the gateway to real smollm2 backends."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.store.models import UsageRecord
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, LLAMA_ALIAS, SINGLE_MODEL_ID, InProcessGateway

pytestmark = pytest.mark.slow
LONG_PROMPT = (
    "You are a careful assistant for a network operations team. Answer briefly and precisely. "
    "The team runs an edge gateway in front of regional GPU backends, with session affinity and "
    "prefix-aware routing, and bills cached input tokens at a discount. Question: what is a KV cache?"
)


@pytest.fixture(scope="module")
def keys(gateway: InProcessGateway) -> dict[str, str]:
    return {"a": gateway.new_key("ta", "acc-a"), "b": gateway.new_key("tb", "acc-b")}


def run_url(gw: InProcessGateway, model: str = DEFAULT_MODEL_ID, account: str = "acc-a") -> str:
    return f"{gw.url}/client/v4/accounts/{account}/ai/run/{model}"


def auth(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


def sse_payloads(text: str) -> list[Any]:
    events = [block.removeprefix("data: ") for block in text.split("\n\n") if block.strip()]
    assert events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


def post(gw: InProcessGateway, secret: str, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return httpx.post(run_url(gw, **kwargs), json=body, headers=auth(secret), timeout=60)


# ---- Workers AI -------------------------------------------------------------------------------


def test_run_prompt_answers_in_the_workers_ai_envelope(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    response = post(gateway, keys["a"], {"prompt": "What is the capital of France?", "max_tokens": 8})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["success"] is True and body["errors"] == [] and body["messages"] == []
    result = body["result"]
    assert isinstance(result["response"], str) and result["response"]
    usage = result["usage"]
    assert 0 < usage["completion_tokens"] <= 8 and usage["prompt_tokens"] > 5
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "cached_tokens" in usage["prompt_tokens_details"]
    record = gateway.ledger_record(response.headers["cf-ray"])
    assert (record.tenant_id, record.account_id, record.status) == ("ta", "acc-a", "ok")
    assert (record.prompt_tokens, record.completion_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])


def test_run_stream_sends_padded_chunks_then_usage_then_done(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    body = {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "stream": True,
    }
    response = post(gateway, keys["a"], body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_payloads(response.text)
    chunks, final = events[:-1], events[-1]
    assert chunks and all(set(c) == {"response", "p"} and c["p"] for c in chunks)
    assert final["response"] == "" and 0 < final["usage"]["completion_tokens"] <= 8
    assert final["usage"]["prompt_tokens_details"]["cached_tokens"] >= 0
    record = gateway.ledger_record(response.headers["cf-ray"])
    assert record.completion_tokens == final["usage"]["completion_tokens"]


def test_raw_prompt_is_sent_without_the_template(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    templated = post(gateway, keys["a"], {"prompt": "Hi", "max_tokens": 1}).json()["result"]["usage"]
    raw = post(gateway, keys["a"], {"prompt": "Hi", "raw": True, "max_tokens": 1}).json()["result"]["usage"]
    assert raw["prompt_tokens"] < templated["prompt_tokens"]  # the template adds the role headers


def test_seeded_sampling_is_reproducible(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    body = {"prompt": "Write a word.", "max_tokens": 6, "temperature": 1.5, "top_k": 40, "top_p": 0.9, "seed": 1234}
    first = post(gateway, keys["a"], body).json()["result"]["response"]
    assert post(gateway, keys["a"], body).json()["result"]["response"] == first


# ---- OpenAI-compatible routes, with the official client ---------------------------------------


@pytest.fixture(scope="module")
def oai(gateway: InProcessGateway, keys: dict[str, str]) -> openai.OpenAI:
    return openai.OpenAI(api_key=keys["a"], base_url=f"{gateway.url}/client/v4/accounts/acc-a/ai/v1", max_retries=0)


def test_openai_chat_completion(oai: openai.OpenAI) -> None:
    answer = oai.chat.completions.create(
        model=DEFAULT_MODEL_ID, messages=[{"role": "user", "content": "Hi!"}], max_tokens=8
    )
    assert answer.object == "chat.completion" and answer.model == DEFAULT_MODEL_ID
    assert answer.choices[0].message.role == "assistant" and answer.choices[0].message.content
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage is not None and 0 < answer.usage.completion_tokens <= 8
    assert (
        answer.usage.prompt_tokens_details is not None and answer.usage.prompt_tokens_details.cached_tokens is not None
    )


def test_openai_chat_stream_with_usage(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model=DEFAULT_MODEL_ID,
        messages=[{"role": "user", "content": "Count: one, two,"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None and 0 < usage.completion_tokens <= 8
    assert all(c.usage is None for c in chunks[:-1])


COUNT = [{"role": "user", "content": "List the days of the week."}]


def test_stop_strings_end_the_answer_before_them_on_both_apis_streamed_or_not(
    oai: openai.OpenAI, gateway: InProcessGateway, keys: dict[str, str]
) -> None:
    """The backend stops at the first stop string and never sends it (greedy decoding: the same tokens up to it)."""
    full = post(gateway, keys["a"], {"messages": COUNT, "max_tokens": 24, "temperature": 0}).json()["result"]["response"]
    stop = full.split()[-3]  # a word from the middle of the answer
    cut = full[: full.index(stop)]
    assert cut and len(cut) < len(full)
    body = {"messages": COUNT, "max_tokens": 24, "temperature": 0, "stop": [stop, "never-written"]}
    assert post(gateway, keys["a"], body).json()["result"]["response"] == cut
    events = sse_payloads(post(gateway, keys["a"], {**body, "stream": True}).text)
    assert "".join(e["response"] for e in events) == cut
    answer = oai.chat.completions.create(model=DEFAULT_MODEL_ID, messages=COUNT, max_tokens=24, temperature=0,
                                         stop=stop)
    assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == (cut, "stop")
    chunks = list(oai.chat.completions.create(model=DEFAULT_MODEL_ID, messages=COUNT, max_tokens=24,
                                              temperature=0, stop=[stop], stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_openai_completions(oai: openai.OpenAI) -> None:
    answer = oai.completions.create(model=DEFAULT_MODEL_ID, prompt="The sky is", max_tokens=5)
    assert answer.object == "text_completion" and answer.choices[0].text
    assert answer.usage is not None and answer.usage.completion_tokens <= 5
    streamed = list(oai.completions.create(model=DEFAULT_MODEL_ID, prompt="The sky is", max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices)


def test_openai_errors_use_the_openai_shape(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model="@cf/nobody/nothing", messages=[{"role": "user", "content": "x"}])
    assert caught.value.body["code"] == "5007"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model=DEFAULT_MODEL_ID, messages=[{"role": "user", "content": "x"}], temperature=3)
    assert caught.value.body["param"] == "temperature"  # type: ignore[index]
    bad_key = openai.OpenAI(api_key="edg_" + "1" * 48, base_url=str(oai.base_url), max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.chat.completions.create(model=DEFAULT_MODEL_ID, messages=[{"role": "user", "content": "x"}])


def test_fields_the_gateway_would_ignore_are_refused_by_name(
    oai: openai.OpenAI, gateway: InProcessGateway, keys: dict[str, str]
) -> None:
    messages: Any = [{"role": "user", "content": "Give me JSON"}]
    with pytest.raises(openai.BadRequestError) as caught:
        oai.chat.completions.create(model=DEFAULT_MODEL_ID, messages=messages, logit_bias={"50256": -100})
    assert caught.value.body["param"] == "logit_bias"  # type: ignore[index]
    response = post(gateway, keys["a"], {"prompt": "x", "functions": [{"name": "f", "parameters": {}}]})
    assert response.status_code == 400
    error = response.json()["errors"][0]
    assert error["code"] == 5004 and error["message"].startswith("functions")


def test_model_search(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    response = httpx.get(
        f"{gateway.url}/client/v4/accounts/acc-a/ai/models/search",
        headers=auth(keys["a"]),
        params={"search": "smollm2-135m"},
    )
    body = response.json()
    assert response.status_code == 200 and body["success"]
    assert [m["name"] for m in body["result"]] == [DEFAULT_MODEL_ID, LLAMA_ALIAS]  # the alias names it
    assert body["result"][0]["task"]["name"] == "Text Generation"
    assert body["result_info"]["total_count"] == 2
    assert {"property_id": "alias_of", "value": DEFAULT_MODEL_ID} in body["result"][1]["properties"]


def test_the_openai_model_list_names_what_the_key_may_use(oai: openai.OpenAI, gateway: InProcessGateway) -> None:
    """`models.list()` (what chat UIs and eval harnesses probe first) and `models.retrieve()` of the openai SDK."""
    listed = {m.id: m for m in oai.models.list()}
    assert set(listed) == {DEFAULT_MODEL_ID, SINGLE_MODEL_ID, LLAMA_ALIAS}  # the alias is a model to the client
    assert listed[LLAMA_ALIAS].object == "model" and listed[LLAMA_ALIAS].owned_by == "huggingface"
    assert listed[DEFAULT_MODEL_ID].created > 0
    assert oai.models.retrieve(LLAMA_ALIAS).id == LLAMA_ALIAS
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("@cf/meta/no-such-model")
    limited = openai.OpenAI(api_key=gateway.new_key("ta", "acc-a", allowed_models=[SINGLE_MODEL_ID]),
                            base_url=str(oai.base_url), max_retries=0)
    assert [m.id for m in limited.models.list()] == [SINGLE_MODEL_ID]
    with pytest.raises(openai.NotFoundError):  # as if it did not exist: a key learns nothing of other models
        limited.models.retrieve(DEFAULT_MODEL_ID)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(api_key="edg_" + "1" * 48, base_url=str(oai.base_url), max_retries=0).models.list()


def test_an_alias_runs_its_model_and_bills_it(
    oai: openai.OpenAI, gateway: InProcessGateway, keys: dict[str, str]
) -> None:
    """A client defaulting to a Workers AI name reaches the model the operator mapped it onto."""
    answer = oai.chat.completions.with_raw_response.create(
        model=LLAMA_ALIAS, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
    )
    completion = answer.parse()
    assert completion.model == DEFAULT_MODEL_ID and completion.choices[0].message.content
    record = gateway.ledger_record(answer.headers["cf-ray"])
    assert record.model == DEFAULT_MODEL_ID
    run = post(gateway, keys["a"], {"prompt": "Hi", "max_tokens": 2}, model=LLAMA_ALIAS)
    assert run.status_code == 200 and run.json()["result"]["response"]


def test_model_schema_describes_input_and_output(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    url = f"{gateway.url}/client/v4/accounts/acc-a/ai/models/schema"
    body = httpx.get(url, params={"model": LLAMA_ALIAS}, headers=auth(keys["a"]), timeout=10).json()
    assert body["success"] is True
    inputs = {variant["title"]: variant for variant in body["result"]["input"]["oneOf"]}
    assert inputs["Prompt"]["required"] == ["prompt"] and inputs["Messages"]["required"] == ["messages"]
    assert inputs["Prompt"]["properties"]["max_tokens"]["default"] == 256
    output = body["result"]["output"]["oneOf"][0]["properties"]
    assert "string" in output["response"]["type"] and "object" in output["response"]["type"]  # text, or JSON mode
    assert "tools" in inputs["Messages"]["properties"] and "tool_calls" in output
    unknown = httpx.get(url, params={"model": "@cf/nobody/nothing"}, headers=auth(keys["a"]), timeout=10)
    assert unknown.status_code == 400 and unknown.json()["errors"][0]["code"] == 5007
    missing = httpx.get(url, headers=auth(keys["a"]), timeout=10)
    assert missing.status_code == 400 and missing.json()["errors"][0]["code"] == 5004
    assert httpx.get(url, params={"model": LLAMA_ALIAS}, timeout=10).status_code == 401


# ---- auth failures ----------------------------------------------------------------------------


def test_auth_failures(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    body = {"prompt": "x", "max_tokens": 1}
    missing = httpx.post(run_url(gateway), json=body, timeout=30)
    wrong = post(gateway, "edg_" + "0" * 48, body)
    other_account = post(gateway, keys["a"], body, account="acc-b")
    for response, status in ((missing, 401), (wrong, 401), (other_account, 403)):
        assert response.status_code == status
        envelope = response.json()
        assert envelope["success"] is False and envelope["result"] is None
        assert envelope["errors"][0]["code"] == 10000


def test_an_unknown_account_answers_as_another_tenants_account_does(
    gateway: InProcessGateway, keys: dict[str, str]
) -> None:
    """Cloudflare's API answers a valid token used with an account it may not use with 403, code 10000
    "Authentication error", whether or not the account exists: an unknown id reveals nothing more."""
    body = {"prompt": "x", "max_tokens": 1}
    for account in ("acc-b", "no-such-account"):
        response = post(gateway, keys["a"], body, account=account)
        assert response.status_code == 403
        error = response.json()["errors"][0]
        assert error["code"] == 10000 and error["message"].startswith("Authentication error")
        assert account in error["message"]
        chat = httpx.post(
            f"{gateway.url}/client/v4/accounts/{account}/ai/v1/chat/completions",
            json={"model": DEFAULT_MODEL_ID, "messages": [{"role": "user", "content": "x"}]},
            headers=auth(keys["a"]),
            timeout=30,
        )
        assert chat.status_code == 403 and chat.json()["error"]["type"] == "permission_error"


def test_a_revoked_key_is_refused_at_once(gateway: InProcessGateway) -> None:
    assert gateway.store is not None
    store = gateway.store
    secret = gateway.new_key("ta", "acc-a")
    assert post(gateway, secret, {"prompt": "x", "max_tokens": 1}).status_code == 200

    async def revoke() -> None:
        key = await store.tenancy.lookup_key(secret)
        assert key is not None
        await store.tenancy.revoke_key(key.id)

    gateway.call(revoke())
    response = post(gateway, secret, {"prompt": "x", "max_tokens": 1})
    assert response.status_code == 401 and response.json()["errors"][0]["code"] == 10000


def test_model_rules(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    unknown = post(gateway, keys["a"], {"prompt": "x"}, model="@cf/nobody/nothing")
    assert unknown.status_code == 400 and unknown.json()["errors"][0]["code"] == 5007
    narrow = gateway.new_key("ta", "acc-a", allowed_models=[SINGLE_MODEL_ID])
    refused = post(gateway, narrow, {"prompt": "x", "max_tokens": 1})
    assert refused.status_code == 403 and refused.json()["errors"][0]["code"] == 5018


# ---- malformed input --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "field"),
    [
        (b'{"prompt": "x",', None),
        (b'["prompt"]', None),
        (b'{"prompt": 42}', "prompt"),
        (b'{"prompt": "x", "max_tokens": "many"}', "max_tokens"),
        (b'{"prompt": "x", "temperature": 9}', "temperature"),
        (b'{"prompt": "x", "top_k": 0}', "top_k"),
        (b'{"prompt": "x", "max_tokens": 100000}', "max_tokens"),  # beyond the model's context
    ],
)
def test_malformed_input_gets_5004(
    gateway: InProcessGateway, keys: dict[str, str], content: bytes, field: str | None
) -> None:
    response = httpx.post(run_url(gateway), content=content, headers=auth(keys["a"]), timeout=30)
    assert response.status_code == 400
    error = response.json()["errors"][0]
    assert error["code"] == 5004
    if field is not None:
        assert field in error["message"]


def test_oversized_bodies_get_413_without_being_read(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    limit = gateway.settings.http.max_body_bytes
    big = json.dumps({"prompt": "x" * (limit + 10)}).encode()
    response = httpx.post(run_url(gateway), content=big, headers=auth(keys["a"]), timeout=30)
    assert response.status_code == 413 and response.json()["errors"][0]["code"] == 3006

    def chunked():  # noqa: ANN202 - no Content-Length, so only reading can tell
        for _ in range(limit // 4096 + 2):
            yield b" " * 4096

    response = httpx.post(run_url(gateway), content=chunked(), headers=auth(keys["a"]), timeout=30)
    assert response.status_code == 413 and response.json()["errors"][0]["code"] == 3006


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b'{"prompt": "x", "temperature": NaN}', "NaN"),
        (b'{"prompt": "x", "top_p": Infinity}', "Infinity"),
        (b'{"prompt": "x\\ud800"}', "surrogate"),
        (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "surrogate"),
        (b'{"prompt": "x", "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests"),
    ],
)
def test_json_nothing_downstream_can_use_gets_5004_not_500(
    gateway: InProcessGateway, keys: dict[str, str], content: bytes, why: str
) -> None:
    response = httpx.post(run_url(gateway), content=content, headers=auth(keys["a"]), timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["errors"][0]
    assert error["code"] == 5004 and why in error["message"]


@pytest.mark.parametrize(
    "content",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
        b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
    ],
)
def test_openai_routes_refuse_the_same_json_with_a_400(
    gateway: InProcessGateway, keys: dict[str, str], content: bytes
) -> None:
    url = f"{gateway.url}/client/v4/accounts/acc-a/ai/v1/chat/completions"
    response = httpx.post(url, content=content, headers=auth(keys["a"]), timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "value",
    [
        '{"a": NaN}',
        '{"a": {"b": 1}}',
        '{"a": [1]}',
        '{"a": null}',
        "[" * 5_000 + "]" * 5_000,  # deep, within the listener's header limit (larger: 431)
        '{"a": "\\ud800"}',
        '{"a": "' + "x" * 300 + '"}',
        '{"k": "' + "x" * 3000 + '"}',
        '{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}',
        '{"a": 123456789012345678901234567890}',
    ],
)
def test_custom_metadata_is_bounded_and_flat(gateway: InProcessGateway, keys: dict[str, str], value: str) -> None:
    headers = {**auth(keys["a"]), "cf-aig-metadata": value}
    response = httpx.post(run_url(gateway), json={"prompt": "x", "max_tokens": 1}, headers=headers, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["errors"][0]["code"] == 5004


# ---- routing: affinity and prefix cache -------------------------------------------------------


def test_session_affinity_holds_across_requests(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    backends = set()
    for i in range(4):
        response = httpx.post(
            run_url(gateway),
            json={"prompt": f"Turn {i}: say something.", "max_tokens": 2},
            headers={**auth(keys["a"]), "x-session-affinity": "session-42"},
            timeout=60,
        )
        assert response.status_code == 200
        backends.add(gateway.ledger_record(response.headers["cf-ray"]).backend_id)
    assert len(backends) == 1


def test_the_routing_decision_is_explained_to_admins_only(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    body = {"prompt": "Explain yourself.", "max_tokens": 2}
    asked = httpx.post(
        run_url(gateway), json=body, headers={**auth(keys["a"]), "x-edgerun-explain": ADMIN_TOKEN}, timeout=60
    )
    explanation = asked.headers["x-edgerun-routing"]
    backend = gateway.ledger_record(asked.headers["cf-ray"]).backend_id
    assert explanation.startswith(f"chosen={backend} ") and ",score=" in explanation
    assert {"b1:cached=", "b2:cached="} <= {part.split(":")[0] + ":cached=" for part in explanation.split()[1:]}
    for wrong in ("not-the-token", ""):
        refused = httpx.post(
            run_url(gateway), json=body, headers={**auth(keys["a"]), "x-edgerun-explain": wrong}, timeout=60
        )
        assert refused.status_code == 200 and "x-edgerun-routing" not in refused.headers


def test_a_repeated_prefix_returns_to_its_backend_and_hits_the_cache(
    gateway: InProcessGateway, keys: dict[str, str]
) -> None:
    first = post(gateway, keys["a"], {"prompt": LONG_PROMPT, "max_tokens": 2})
    second = post(gateway, keys["a"], {"prompt": LONG_PROMPT, "max_tokens": 2})
    usage = second.json()["result"]["usage"]
    assert gateway.ledger_record(first.headers["cf-ray"]).backend_id == gateway.ledger_record(second.headers["cf-ray"]).backend_id
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 32  # at least two full 16-token blocks
    assert gateway.ledger_record(second.headers["cf-ray"]).cached_tokens == usage["prompt_tokens_details"]["cached_tokens"]


def test_another_tenant_never_gets_the_cached_tokens(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    prompt = LONG_PROMPT + " (single backend)"
    post(gateway, keys["a"], {"prompt": prompt, "max_tokens": 1}, model=SINGLE_MODEL_ID)
    warm = post(gateway, keys["a"], {"prompt": prompt, "max_tokens": 1}, model=SINGLE_MODEL_ID)
    assert warm.json()["result"]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    other = post(gateway, keys["b"], {"prompt": prompt, "max_tokens": 1}, model=SINGLE_MODEL_ID, account="acc-b")
    assert other.status_code == 200
    assert other.json()["result"]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert gateway.ledger_record(other.headers["cf-ray"]).backend_id == "b1"  # the same backend held the blocks


# ---- cancellation and observability -----------------------------------------------------------


def test_a_client_that_leaves_cancels_the_generation_and_is_billed_for_what_was_made_and_cached(
    gateway: InProcessGateway, keys: dict[str, str]
) -> None:
    prompt = LONG_PROMPT + " Now write a long story about the sea."
    post(gateway, keys["a"], {"prompt": prompt, "max_tokens": 1}, model=SINGLE_MODEL_ID)  # caches the prompt
    body = {
        "prompt": prompt,
        "max_tokens": 400,
        "stream": True,
        "temperature": 0.8,
        "seed": 7,
        "repetition_penalty": 1.3,
    }
    with httpx.stream(
        "POST", run_url(gateway, model=SINGLE_MODEL_ID), json=body, headers=auth(keys["a"]), timeout=60
    ) as response:
        request_id = response.headers["cf-ray"]
        received = 0
        for line in response.iter_lines():
            if line.startswith("data: {"):
                received += 1
                if received == 3:
                    break
    record = gateway.ledger_record(request_id)
    assert record.status == "cancelled"
    assert 3 <= record.completion_tokens < 400
    # the backend reported usage on every chunk, so the cached part of the prompt is billed at the
    # cached rate even though the stream never reached its final usage event
    assert record.cached_tokens >= 16 and record.cached_tokens <= record.prompt_tokens
    # the backend stops generating: nothing stays running there
    deadline = time.monotonic() + 10
    while httpx.get(f"{gateway.settings.fleet.backends[0].base_url}/load", timeout=5).json()["running"] > 0:
        assert time.monotonic() < deadline, "the backend kept generating after the client left"
        time.sleep(0.1)


def test_a_whole_answer_whose_client_leaves_is_cancelled_and_billed_as_cancelled(gateway: InProcessGateway) -> None:
    secret = gateway.new_key("t-leaver", "acc-leaver")
    body = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,", "raw": True, "max_tokens": 1500, "temperature": 0.0}
    started = time.time()
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        httpx.post(run_url(gateway, model=SINGLE_MODEL_ID, account="acc-leaver"), json=body, headers=auth(secret),
                   timeout=httpx.Timeout(60, read=2.0))
    assert gateway.store is not None
    store = gateway.store
    deadline = time.monotonic() + 10
    while not (records := gateway.call(_records(store, "t-leaver", started))):
        assert time.monotonic() < deadline, "no ledger record for the request whose client left"
        time.sleep(0.1)
    [record] = records
    assert record.status == "cancelled" and 0 < record.completion_tokens < 1500
    assert record.ended_at - started < 8  # settled when the client left, not when 1500 tokens were done
    deadline = time.monotonic() + 10  # and the backend stopped generating
    while httpx.get(f"{gateway.settings.fleet.backends[0].base_url}/load", timeout=5).json()["running"] > 0:
        assert time.monotonic() < deadline, "the backend kept generating after the client left"
        time.sleep(0.1)


async def _records(store: Any, tenant: str, since: float) -> list[UsageRecord]:
    return [r async for r in store.ledger.iter_usage(since - 1, time.time() + 60, tenant)]


def test_metrics_and_healthz(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    post(gateway, keys["a"], {"prompt": "x", "max_tokens": 1})
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    for name in (
        "edgerun_gateway_requests_total",
        "edgerun_gateway_time_to_first_token_seconds_bucket",
        "edgerun_gateway_tokens_total",
        "edgerun_gateway_cached_tokens_total",
        "edgerun_gateway_routing_decisions_total",
        "edgerun_gateway_backend_healthy",
    ):
        assert name in text, name
    assert f'model="{DEFAULT_MODEL_ID}"' in text and 'policy="cache_aware"' in text
    health = httpx.get(f"{gateway.url}/healthz", timeout=10).json()
    assert health == {"status": "ok", "backends": {"b1": True, "b2": True}, "billing": []}


def test_the_gateway_tokenizes_exactly_as_the_backend(gateway: InProcessGateway, keys: dict[str, str]) -> None:
    """Templated and tokenized at the gateway, sent as ids: the same prompt and greedy answer as the
    backend's own chat route, which templates and tokenizes the text itself."""
    messages = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Capital of Italy? Ünïcode ok."},
    ]
    through = post(gateway, keys["a"], {"messages": messages, "max_tokens": 6, "temperature": 0}).json()["result"]
    direct = httpx.post(
        f"{gateway.settings.fleet.backends[0].base_url}/v1/chat/completions",
        json={"messages": messages, "max_tokens": 6, "temperature": 0.0},
        timeout=60,
    ).json()
    assert through["usage"]["prompt_tokens"] == direct["usage"]["prompt_tokens"]
    assert through["response"] == direct["choices"][0]["message"]["content"]
