"""The client libraries people point at Workers AI, with their own defaults, against the gateway and
real smollm2 backends: Cloudflare's LangChain package in both endpoint formats, the official
`cloudflare` SDK and the official `openai` SDK. Only the base URL, the account and the key change."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import cloudflare
import openai
import pytest
from langchain_cloudflare import ChatCloudflareWorkersAI
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from gateway.fleet.catalog import DEFAULT_MODEL_ID
from tests.gateway.fixtures_e2e import LLAMA_ALIAS, SINGLE_MODEL_ID, InProcessGateway

pytestmark = pytest.mark.slow
ACCOUNT = "acc-sdk"
DAYS = [SystemMessage("Answer briefly."), HumanMessage("List the days of the week.")]


@pytest.fixture(scope="module")
def key(gateway: InProcessGateway) -> str:
    return gateway.new_key("t-sdk", ACCOUNT)


@contextlib.contextmanager
def chat_model(
    gateway: InProcessGateway, key: str, endpoint_format: str, **options: object
) -> Iterator[ChatCloudflareWorkersAI]:
    """As langchain-cloudflare's README builds it, pointed at the gateway (its `base_url`, for proxies);
    its HTTP client closed at the end (the package never closes it)."""
    llm = ChatCloudflareWorkersAI(model=LLAMA_ALIAS, account_id=ACCOUNT, api_token=key,
                                  base_url=f"{gateway.url}/client/v4", endpoint_format=endpoint_format, **options)
    try:
        yield llm
    finally:
        llm.client.close()


@pytest.mark.parametrize("endpoint_format", ["workers_ai", "openai_compatible"])
def test_langchain_cloudflare_invokes_and_streams(gateway: InProcessGateway, key: str, endpoint_format: str) -> None:
    """Its defaults send `"temperature": 0.7, "stop": null` (the 400 of issue 29 on /ai/run)."""
    with chat_model(gateway, key, endpoint_format, max_tokens=16) as llm:
        answer = llm.invoke(DAYS)
        assert isinstance(answer, AIMessage) and isinstance(answer.content, str) and answer.content.strip()
        assert answer.usage_metadata is not None and 0 < answer.usage_metadata["output_tokens"] <= 16
        assert "".join(str(chunk.content) for chunk in llm.stream(DAYS)).strip()


@pytest.mark.parametrize("endpoint_format", ["workers_ai", "openai_compatible"])
def test_langchain_cloudflare_stop_sequences_and_reject_if_busy(
    gateway: InProcessGateway, key: str, endpoint_format: str
) -> None:
    """Its `stop` and `reject_if_busy` (options.rejectIfBusy) reach the model: the answer ends before the stop."""
    with chat_model(gateway, key, endpoint_format, max_tokens=24, temperature=0, reject_if_busy=True) as llm:
        full = str(llm.invoke(DAYS).content)
        assert "Tuesday" in full, full
        cut = str(llm.invoke(DAYS, stop=["Tuesday"]).content)
        assert cut == full[: full.index("Tuesday")]
        assert "".join(str(chunk.content) for chunk in llm.stream(DAYS, stop=["Tuesday"])) == cut


def test_the_cloudflare_sdk(gateway: InProcessGateway, key: str) -> None:
    with cloudflare.Cloudflare(api_token=key, base_url=f"{gateway.url}/client/v4") as cf:
        answer = cf.ai.run(DEFAULT_MODEL_ID, account_id=ACCOUNT, messages=[{"role": "user", "content": "Hi!"}],
                           max_tokens=8)
        assert isinstance(answer, dict) and answer["response"] and 0 < answer["usage"]["completion_tokens"] <= 8
        assert cf.ai.run(LLAMA_ALIAS, account_id=ACCOUNT, prompt="Say hi.", max_tokens=4)["response"]  # type: ignore[index]
        names = [model["name"] for model in cf.ai.models.list(account_id=ACCOUNT)]
        assert {DEFAULT_MODEL_ID, SINGLE_MODEL_ID, LLAMA_ALIAS} <= set(names)
        schema = cf.ai.models.schema.get(account_id=ACCOUNT, model=DEFAULT_MODEL_ID)
        assert schema.input.type == "object" and schema.input.additional_properties is True  # the SDK's typed fields
        assert {"stop", "options"} <= set(schema.to_dict()["input"]["oneOf"][1]["properties"])


def test_the_openai_sdk(gateway: InProcessGateway, key: str) -> None:
    with openai.OpenAI(api_key=key, base_url=f"{gateway.url}/client/v4/accounts/{ACCOUNT}/ai/v1") as oai:
        assert {DEFAULT_MODEL_ID, SINGLE_MODEL_ID, LLAMA_ALIAS} <= {model.id for model in oai.models.list()}
        hi = [{"role": "user", "content": "Hi!"}]
        answer = oai.chat.completions.create(model=LLAMA_ALIAS, messages=hi, max_tokens=8)  # type: ignore[arg-type]
        assert answer.choices[0].message.content and answer.model == DEFAULT_MODEL_ID
        chunks = list(oai.chat.completions.create(model=DEFAULT_MODEL_ID, messages=hi, max_tokens=8,  # type: ignore[arg-type]
                                                  stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert oai.responses.create(model=DEFAULT_MODEL_ID, input="Say hi.", max_output_tokens=8).output_text
