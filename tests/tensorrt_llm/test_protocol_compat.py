"""The gateway's client speaks to our backend with exactly the request shape trtllm-serve accepts.

trtllm-serve's CompletionRequest takes the prompt as token ids plus OpenAI sampling fields and
its extensions (top_k, repetition_penalty, ignore_eos, cache_salt); the client must send that body
unchanged (adding only stream and stream_options.include_usage) and our server must accept it,
so the same gateway code drives either backend.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping

import pytest

from backends.client import BackendClient, Endpoint
from backends.client.http import HTTPTransport, Response
from tests.backends.conftest import BackendProcess, long_prompt_ids, running_backend

pytestmark = pytest.mark.slow

# Fields of tensorrt_llm.serve.openai_protocol.CompletionRequest the gateway uses.
TRTLLM_BODY = {
    "model": "smollm2",
    "prompt": long_prompt_ids(48, offset=17),
    "max_tokens": 6,
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "seed": 1234,
    "repetition_penalty": 1.1,
    "frequency_penalty": 0.1,
    "presence_penalty": 0.1,
    "stop": ["\n\n\n"],
    "ignore_eos": True,
    "cache_salt": "tenant-42",
    "user": "tenant-42",
}


class RecordingTransport(HTTPTransport):
    """The real network transport, keeping each /v1/completions body it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[dict] = []

    async def request(
        self, method: str, url: str, body: bytes | None = None, *, timeout_s: float, headers: Mapping[str, str] | None = None
    ) -> Response:
        if method == "POST" and url.endswith("/v1/completions"):
            self.bodies.append(json.loads(body or b""))
        return await super().request(method, url, body, timeout_s=timeout_s, headers=headers)


@pytest.fixture(scope="module")
def backend() -> Iterator[BackendProcess]:
    with running_backend() as process:
        yield process


@pytest.fixture
async def recorded() -> AsyncIterator[tuple[BackendClient, RecordingTransport]]:
    transport = RecordingTransport()
    client = BackendClient(transport=transport)
    yield client, transport
    await client.aclose()


async def test_stream_body_is_the_trtllm_shape(
    backend: BackendProcess, recorded: tuple[BackendClient, RecordingTransport]
) -> None:
    client, transport = recorded
    endpoint = Endpoint(id="ours", base_url=backend.url, region="local")
    chunks = [chunk async for chunk in client.stream_completion(endpoint, TRTLLM_BODY)]
    [sent] = transport.bodies
    # trtllm-serve's StreamOptions declares both fields (and forbids unknown ones)
    assert sent == {**TRTLLM_BODY, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == 48 and usage.completion_tokens == 6


async def test_non_streaming_body_is_the_trtllm_shape(
    backend: BackendProcess, recorded: tuple[BackendClient, RecordingTransport]
) -> None:
    client, transport = recorded
    endpoint = Endpoint(id="ours", base_url=backend.url, region="local")
    await client.complete(endpoint, TRTLLM_BODY)
    _, finish_reason, usage = await client.complete(endpoint, TRTLLM_BODY)
    assert transport.bodies == [{**TRTLLM_BODY, "stream": False}] * 2
    assert finish_reason == "length" and usage.completion_tokens == 6
    assert usage.cached_tokens >= 32  # same salt and prompt as before: its full blocks hit
