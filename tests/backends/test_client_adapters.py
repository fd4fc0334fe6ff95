"""The client loading LoRA adapters on vLLM endpoints (backends/client/adapters.py), against a loopback
peer that answers as vLLM does: loaded once per server, "already loaded" taken as loaded, reloaded after
the server's 404, a server that cannot load adapters refused with what its operator must do, and unloading
(a name it does not have counts as unloaded; the next use loads it again). The real vLLM runs the same path
in tests/vllm/test_vllm_lora.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from backends.client import BackendClient, BackendRejected, Endpoint
from tests.backends.loopback import LoopbackServer

ADAPTER = "ft-0001"
DONE = b'data: {"choices":[{"index":0,"text":"hi","finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


class FakeVllm(LoopbackServer):
    """Answers `/v1/load_lora_adapter` and `/v1/completions` as vLLM does; `load_status` / `load_body` set
    the load's answer (404 "Not Found": runtime loading is off), `loaded` the adapters it has."""

    def __init__(self, load_status: int = 200, load_body: str = "Success") -> None:
        super().__init__()
        self.load_status, self.load_body = load_status, load_body
        self.loaded: set[str] = set()
        self.loads: list[dict[str, Any]] = []
        self.completions: list[str] = []
        self._writers: list[asyncio.StreamWriter] = []

    def endpoint(self, lora_dir: str | None = "/srv/finetunes") -> Endpoint:
        return Endpoint(id="vllm-x", base_url=f"http://127.0.0.1:{self.port}", region="local", kind="vllm",
                        lora_dir=lora_dir)

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._writers:
            writer.close()
        await super().__aexit__(*exc)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                lines = head.decode().split("\r\n")
                path = lines[0].split()[1]
                length = next((int(v) for k, _, v in (h.partition(": ") for h in lines[1:]) if k.lower() == "content-length"), 0)
                body = json.loads(await reader.readexactly(length)) if length else {}
                status, payload, kind = self._answer(path, body)
                writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: {kind}\r\ncontent-length: {len(payload)}\r\n\r\n".encode() + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def _answer(self, path: str, body: dict[str, Any]) -> tuple[int, bytes, str]:
        if path == "/v1/unload_lora_adapter":
            if body["lora_name"] not in self.loaded:
                return 404, error(f"The lora adapter '{body['lora_name']}' cannot be found."), "application/json"
            self.loaded.discard(body["lora_name"])
            return 200, b'"Success"', "application/json"
        if path == "/v1/load_lora_adapter":
            self.loads.append(body)
            if self.load_status == 200:
                if body["lora_name"] in self.loaded:
                    return 400, error(f"The lora adapter '{body['lora_name']}' has already been loaded."), "application/json"
                self.loaded.add(body["lora_name"])
            return self.load_status, self.load_body.encode(), "application/json"
        self.completions.append(body["model"])
        if body["model"] != "base" and body["model"] not in self.loaded:
            return 404, error(f"The model `{body['model']}` does not exist."), "application/json"
        return 200, DONE, "text/event-stream"


def error(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "code": 400}}).encode()


@pytest.fixture
async def client() -> AsyncIterator[BackendClient]:
    client = BackendClient()
    yield client
    await client.aclose()


async def complete(client: BackendClient, endpoint: Endpoint, model: str = ADAPTER) -> str:
    _, stream = await client.stream_with_failover([endpoint], {"model": model, "prompt": [1, 2]},
                                                  adapter=None if model == "base" else model)
    return "".join([chunk.text async for batch in stream for chunk in batch])


async def test_an_adapter_is_loaded_once_per_server_from_its_lora_dir(client: BackendClient) -> None:
    async with FakeVllm() as vllm:
        answers = await asyncio.gather(*(complete(client, vllm.endpoint()) for _ in range(3)))
        assert answers == ["hi"] * 3
        assert vllm.loads == [{"lora_name": ADAPTER, "lora_path": f"/srv/finetunes/{ADAPTER}"}]  # one load for all
        assert await complete(client, vllm.endpoint(), "base") == "hi" and len(vllm.loads) == 1  # base: no load


async def test_already_loaded_counts_and_a_forgetful_server_gets_it_again(client: BackendClient) -> None:
    async with FakeVllm() as vllm:
        vllm.loaded.add(ADAPTER)  # another gateway replica loaded it
        assert await complete(client, vllm.endpoint()) == "hi"
        vllm.loaded.clear()  # the server restarted
        assert await complete(client, vllm.endpoint()) == "hi"
        assert [load["lora_name"] for load in vllm.loads] == [ADAPTER, ADAPTER]
        assert vllm.completions == [ADAPTER, ADAPTER, ADAPTER]  # the 404, then the retry


@pytest.mark.parametrize(("status", "body", "lora_dir"), [
    (404, '{"detail":"Not Found"}', "/srv/finetunes"),  # no VLLM_ALLOW_RUNTIME_LORA_UPDATING: no such route
    (500, '{"error":{"message":"LoRA is not enabled","code":500}}', "/srv/finetunes"),  # no --enable-lora
    (200, "Success", None),  # the backend has no lora_dir
])
async def test_a_server_that_cannot_load_adapters_is_refused_with_the_fix(
    client: BackendClient, status: int, body: str, lora_dir: str | None
) -> None:
    async with FakeVllm(load_status=status, load_body=body) as vllm:
        with pytest.raises(BackendRejected) as refused:
            await complete(client, vllm.endpoint(lora_dir))
        assert refused.value.status == 400 and "--enable-lora" in refused.value.message
        assert vllm.completions == []
        assert await complete(client, vllm.endpoint(lora_dir), "base") == "hi"  # the base model still runs


async def test_unloading_frees_the_adapter_and_the_next_use_loads_it_again(client: BackendClient) -> None:
    async with FakeVllm() as vllm:
        assert await complete(client, vllm.endpoint()) == "hi"
        assert await client.unload_adapter(vllm.endpoint(), ADAPTER) is True
        assert vllm.loaded == set()
        assert await client.unload_adapter(vllm.endpoint(), ADAPTER) is False  # vLLM's 404 "cannot be found"
        assert await complete(client, vllm.endpoint()) == "hi"  # loaded again first, no 404 round trip
        assert len(vllm.loads) == 2 and vllm.completions == [ADAPTER, ADAPTER]
