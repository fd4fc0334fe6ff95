"""tests/gateway/stub_backend.py as a real process: its chat route (what a router in front of it forwards)
streams the same answer as its completions route, as OpenAI chat chunks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cli.processes import ChildProcess
from tests.gateway.stub_backend import start_stub

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stub() -> Iterator[ChildProcess]:
    process = start_stub(3)
    yield process
    process.stop(timeout_s=10)


def events(base: str, path: str, body: dict[str, object]) -> list[Any]:
    with httpx.stream("POST", base + path, json=body, timeout=10.0) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_chat_route_streams_chat_chunks_then_usage(stub: ChildProcess) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "three words here"}]
    *chunks, last = events(stub.url, "/v1/chat/completions", {"model": "stub", "messages": messages, "stream": True})
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 3
    assert [c["choices"][0]["delta"] for c in chunks] == [{"content": " tok"}] * 3
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert last["choices"] == []
    assert last["usage"]["prompt_tokens"] == 5 and last["usage"]["completion_tokens"] == 3


def test_completions_route_still_streams_text_chunks(stub: ChildProcess) -> None:
    *chunks, last = events(stub.url, "/v1/completions", {"model": "stub", "prompt": [1, 2, 3, 4], "stream": True})
    assert [c["choices"][0]["text"] for c in chunks] == [" tok"] * 3
    assert all(c["object"] == "text_completion" for c in chunks)
    assert last["usage"]["prompt_tokens"] == 4
