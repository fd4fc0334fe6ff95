"""Each backend kind gets the request shape its server takes, through the real client and a
loopback HTTP peer that records what it was sent (and answers like vLLM without
--enable-prompt-tokens-details: usage with no cached_tokens)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from backends.client import BackendClient, Endpoint
from backends.client.kinds import KINDS, kind_of
from tests.backends.loopback import LoopbackServer

BODY = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 2, "cache_salt": "salt-a", "return_token_ids": True}
ANSWER = [
    {"choices": [{"index": 0, "text": "hi", "token_ids": [7], "finish_reason": None}],
     "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}},
    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}},
]


class RecordingServer(LoopbackServer):
    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[dict[str, Any]] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
        self.bodies.append(json.loads(await reader.readexactly(length)))
        events = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in ANSWER) + b"data: [DONE]\n\n"
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
                     + f"content-length: {len(events)}\r\n\r\n".encode() + events)
        await writer.drain()
        writer.close()


@pytest.fixture
async def server() -> AsyncIterator[RecordingServer]:
    async with RecordingServer() as started:
        yield started


async def sent_to(server: RecordingServer, kind: str, return_token_ids: bool | None = None) -> tuple[dict[str, Any], bool]:
    """The body `kind`'s endpoint was sent, and whether the answer's last usage reported cached tokens."""
    endpoint = Endpoint("b", f"http://127.0.0.1:{server.port}", "local", kind=kind, return_token_ids=return_token_ids)
    client = BackendClient()
    try:
        chunks = [chunk async for chunk in client.stream_completion(endpoint, dict(BODY))]
    finally:
        await client.aclose()
    return server.bodies[-1], [c for c in chunks if c.has_usage][-1].reports_cached_tokens


@pytest.mark.parametrize("kind", ["edgerun", "vllm"])
async def test_vllm_and_ours_get_the_salt_token_ids_and_continuous_usage(server: RecordingServer, kind: str) -> None:
    body, reports_cached = await sent_to(server, kind)
    assert body["cache_salt"] == "salt-a" and body["return_token_ids"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert reports_cached is False  # the peer answered like vLLM without --enable-prompt-tokens-details


@pytest.mark.parametrize("kind", ["trtllm", "sglang"])
async def test_trtllm_and_sglang_get_the_salt_but_token_ids_only_when_configured(server: RecordingServer, kind: str) -> None:
    body, _ = await sent_to(server, kind)
    assert body["cache_salt"] == "salt-a" and "return_token_ids" not in body
    body, _ = await sent_to(server, kind, return_token_ids=True)
    assert body["return_token_ids"] is True


async def test_a_plain_openai_server_gets_no_extensions(server: RecordingServer) -> None:
    body, _ = await sent_to(server, "openai", return_token_ids=True)
    assert {"cache_salt", "return_token_ids"}.isdisjoint(body)
    assert body["stream_options"] == {"include_usage": True}
    assert body["prompt"] == [1, 2, 3] and body["max_tokens"] == 2


def test_shaping_leaves_the_callers_body_alone() -> None:
    body = {**BODY, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    before = json.dumps(body, sort_keys=True)
    kind_of("openai").shape(body, return_token_ids=False)
    assert json.dumps(body, sort_keys=True) == before


def test_every_kind_says_how_its_events_arrive_and_how_to_get_cached_tokens() -> None:
    assert {k.name: k.kv_events for k in KINDS.values()} == {
        "edgerun": "poll", "trtllm": "poll", "vllm": "zmq", "sglang": "zmq", "openai": None,
    }
    assert "--enable-prompt-tokens-details" in (kind_of("vllm").cached_tokens_fix or "")
    assert "--enable-cache-report" in (kind_of("sglang").cached_tokens_fix or "")
    with pytest.raises(ValueError, match="choose one of"):
        kind_of("tgi")
