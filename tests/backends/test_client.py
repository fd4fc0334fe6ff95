"""BackendClient against a real backend process (2 running slots, no queue), plus dead and silent peers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from backends.client import (
    BackendClient,
    BackendOverloaded,
    BackendRejected,
    BackendStreamBroken,
    BackendTimeout,
    BackendUnavailable,
    ClientAtCapacity,
    CompletionChunk,
    Endpoint,
)
from backends.client.client import DRAIN_TIMEOUT_S
from cli.processes import free_port
from tests.backends.conftest import BackendProcess, long_prompt_ids, running_backend
from tests.backends.loopback import LoopbackServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def backend() -> Iterator[BackendProcess]:
    with running_backend("--region", "eu-west", "--max-num-seqs", "2", "--max-queue", "0") as process:
        yield process


@pytest.fixture
def live(backend: BackendProcess) -> Endpoint:
    return Endpoint(id="live", base_url=backend.url, region="eu-west")


@pytest.fixture
def dead() -> Endpoint:
    return Endpoint(id="dead", base_url=f"http://127.0.0.1:{free_port()}", region="eu-west")  # nothing listens


@pytest.fixture
async def client() -> AsyncIterator[BackendClient]:
    client = BackendClient(connect_timeout_s=1.0, first_byte_timeout_s=30.0, read_timeout_s=60.0)
    yield client
    await client.aclose()


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[Endpoint]:
    """A TCP peer that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Endpoint(id="silent", base_url=f"http://127.0.0.1:{port}", region="eu-west")
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


class CountingSSEServer(LoopbackServer):
    """A loopback HTTP/1.1 peer that answers every POST with a chunked SSE stream (two text events,
    usage, [DONE]) and counts the TCP connections it accepts and sees closed.

    `after_done`: "end" finishes the body (keep-alive), "stall" never sends the body's end;
    `hold_after_first` sends one event, then waits for the client to go away.
    """

    def __init__(self, after_done: str = "end", hold_after_first: bool = False) -> None:
        super().__init__()
        self.after_done = after_done
        self.hold_after_first = hold_after_first
        self.accepted = 0
        self.closed = 0

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(id="counting", base_url=f"http://127.0.0.1:{self.port}", region="eu-west")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1

        def send_event(data: str) -> None:
            event = f"data: {data}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))

        usage = {"prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}}
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
                await reader.readexactly(int(length.group(1)) if length else 0)
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                send_event(json.dumps({"choices": [{"index": 0, "text": "a", "finish_reason": None}]}))
                if self.hold_after_first:
                    await writer.drain()
                    await reader.read()  # until the client closes the connection
                    return
                send_event(json.dumps({"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}))
                send_event(json.dumps({"choices": [], "usage": usage}))
                send_event("[DONE]")
                if self.after_done == "stall":
                    await writer.drain()
                    await reader.read()
                    return
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed += 1
            writer.close()


def body(num_prompt_tokens: int = 24, max_tokens: int = 6, offset: int = 0, **extra: object) -> dict:
    return {"prompt": long_prompt_ids(num_prompt_tokens, offset), "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, **extra}


async def collect(stream: AsyncIterator[CompletionChunk]) -> list[CompletionChunk]:
    return [chunk async for chunk in stream]


async def collect_batches(stream: AsyncIterator[list[CompletionChunk]]) -> list[CompletionChunk]:
    return [chunk async for batch in stream for chunk in batch]


async def wait_idle(backend: BackendProcess) -> None:
    await asyncio.to_thread(backend.wait_until, lambda load: load["in_flight"] == 0 and load["running"] == 0, 15)


async def test_stream_completion_yields_text_then_usage(client: BackendClient, live: Endpoint) -> None:
    chunks = await collect(client.stream_completion(live, body(max_tokens=6)))
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert usage_chunk.usage is not None and usage_chunk.text == ""
    assert usage_chunk.usage.prompt_tokens == 24
    assert usage_chunk.usage.completion_tokens == 6
    assert usage_chunk.usage.cached_tokens >= 0
    assert text_chunks[-1].finish_reason == "length"
    # continuous usage: every text chunk carries the usage so far, ending where the final one does
    assert all(chunk.usage is not None and chunk.usage.prompt_tokens == 24 for chunk in text_chunks)
    assert text_chunks[-1].usage == usage_chunk.usage
    assert "".join(chunk.text for chunk in text_chunks)


async def test_complete_matches_the_stream(client: BackendClient, live: Endpoint) -> None:
    request = body(max_tokens=8, offset=3, return_token_ids=True)
    chunks = await collect(client.stream_completion(live, {**request, "cache_salt": "stream"}))
    text, finish_reason, usage = await client.complete(live, {**request, "cache_salt": "whole"})  # same computation
    assert text == "".join(chunk.text for chunk in chunks)
    assert finish_reason == "length"
    assert usage.prompt_tokens == 24 and usage.completion_tokens == 8 and usage.cached_tokens == 0
    assert sum(len(chunk.token_ids or []) for chunk in chunks) == 8
    _, _, again = await client.complete(live, {**request, "cache_salt": "whole"})
    assert again.cached_tokens >= 16  # the prompt's full block is cached now


async def test_failover_moves_past_a_refused_endpoint(client: BackendClient, live: Endpoint, dead: Endpoint) -> None:
    endpoint, stream = await client.stream_with_failover([dead, live], body())
    assert endpoint is live
    chunks = await collect_batches(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


async def test_failover_with_every_endpoint_down(client: BackendClient, dead: Endpoint) -> None:
    other = Endpoint(id="dead-2", base_url=f"http://127.0.0.1:{free_port()}", region="us-east")
    with pytest.raises(BackendUnavailable, match="all 2 endpoints failed") as caught:
        await client.stream_with_failover([dead, other], body())
    assert not caught.value.answered  # a connection failure: the backend's own, whatever was asked
    with pytest.raises(BackendUnavailable):
        await collect(client.stream_completion(dead, body()))
    with pytest.raises(BackendUnavailable):
        await client.complete(dead, body())


async def test_a_rejected_request_is_not_failed_over(client: BackendClient, live: Endpoint, dead: Endpoint) -> None:
    with pytest.raises(BackendRejected) as info:
        await client.stream_with_failover([live, dead], body(n=2))
    assert info.value.status == 400 and "n=2" in info.value.message
    with pytest.raises(BackendRejected) as info:
        await client.complete(live, body(temperature=9.0))
    assert info.value.status == 400 and info.value.endpoint_id == "live"


async def test_a_generation_step_without_kv_state_is_rejected(client: BackendClient, live: Endpoint) -> None:
    with pytest.raises(BackendRejected, match="encoded_opaque_state"):
        await client.complete(live, body(disaggregated_params={"request_type": "generation_only"}))


async def test_overload_is_reported_with_retry_after(
    client: BackendClient, live: Endpoint, backend: BackendProcess
) -> None:
    first = client.stream_completion(live, body(max_tokens=4000, offset=1))
    second = client.stream_completion(live, body(max_tokens=4000, offset=2))
    try:
        await anext(first)
        await anext(second)
        with pytest.raises(BackendOverloaded) as info:
            await collect(client.stream_completion(live, body()))
        assert info.value.retry_after_s == 1.0
        with pytest.raises(BackendOverloaded):
            await client.stream_with_failover([live], body())
    finally:
        await first.aclose()
        await second.aclose()
    await wait_idle(backend)


async def test_first_byte_timeout(live: Endpoint) -> None:
    impatient = BackendClient(first_byte_timeout_s=0.01)
    try:
        with pytest.raises(BackendTimeout, match="first-byte timeout"):
            await collect(impatient.stream_completion(live, body(num_prompt_tokens=1500, max_tokens=1)))
    finally:
        await impatient.aclose()


async def test_silent_peer_times_out() -> None:
    client = BackendClient(first_byte_timeout_s=0.3, read_timeout_s=0.3)
    try:
        async with silent_server() as silent:
            with pytest.raises(BackendTimeout):
                await collect(client.stream_completion(silent, body()))
            with pytest.raises(BackendTimeout):
                await client.complete(silent, body())
            assert await client.health(silent) is False
    finally:
        await client.aclose()


async def test_closing_the_stream_cancels_on_the_backend(
    client: BackendClient, live: Endpoint, backend: BackendProcess
) -> None:
    stream = client.stream_completion(live, body(max_tokens=4000, offset=5))
    await anext(stream)
    assert backend.load()["running"] == 1
    await stream.aclose()
    await wait_idle(backend)


async def test_cancelling_the_consumer_task_cancels_on_the_backend(
    client: BackendClient, live: Endpoint, backend: BackendProcess
) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        _, stream = await client.stream_with_failover([live], body(max_tokens=4000, offset=6))
        async for _chunk in stream:
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_idle(backend)


async def test_polling_endpoints(client: BackendClient, live: Endpoint, dead: Endpoint) -> None:
    assert await client.health(live) is True
    assert await client.health(dead) is False
    load = await client.load(live)
    assert load["region"] == "eu-west" and load["kv_blocks_total"] > 0
    assert await client.models(live) == ["smollm2"]
    await client.kv_cache_events(live)
    await client.complete(live, body(num_prompt_tokens=32, max_tokens=1, offset=40, cache_salt="poll"))
    events = await client.kv_cache_events(live)
    assert any(event["data"]["type"] == "stored" for event in events)
    with pytest.raises(BackendUnavailable):
        await client.load(dead)


async def test_tokenizer_payload(client: BackendClient, live: Endpoint, dead: Endpoint) -> None:
    payload = await client.tokenizer(live)
    assert payload["tokenizer_json"].startswith("{") and payload["max_model_len"] > 0
    with pytest.raises(BackendUnavailable, match="dead"):
        await client.tokenizer(dead)


async def test_a_backend_dying_mid_stream_breaks_the_stream(
    client: BackendClient, live: Endpoint, backend: BackendProcess
) -> None:
    """Last in the module: it kills the module's backend."""
    stream = client.stream_completion(live, body(max_tokens=4000, offset=7))
    await anext(stream)
    backend.process.send_signal(signal.SIGKILL)
    with pytest.raises(BackendStreamBroken):
        async for _chunk in stream:
            pass


async def test_streams_read_to_done_reuse_one_connection(client: BackendClient) -> None:
    async with CountingSSEServer() as server:
        for _ in range(3):
            chunks = await collect(client.stream_completion(server.endpoint, body()))
            assert [chunk.text for chunk in chunks] == ["a", "b", ""]
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 2
        endpoint, stream = await client.stream_with_failover([server.endpoint], body())
        assert len(await collect_batches(stream)) == 3
        assert server.accepted == 1 and server.closed == 0


async def serve_at_once(events: list[str]) -> tuple[asyncio.Server, Endpoint]:
    """A peer that answers a POST with its whole SSE body (`events`, then [DONE]) in one write."""
    payload = "".join(f"data: {data}\n\n" for data in [*events, "[DONE]"]).encode()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:  # keep-alive: every request on the connection
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"content-length: *(\d+)", head, re.IGNORECASE)
                await reader.readexactly(int(length.group(1)) if length else 0)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(payload), payload))
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, Endpoint(id="at-once", base_url=f"http://127.0.0.1:{port}", region="eu-west")


async def test_a_5xx_answer_is_an_answered_failure_and_a_refusal_is_not(client: BackendClient, dead: Endpoint) -> None:
    async def answer_500(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            error = b'{"error": {"message": "Value is not JSON serializable"}}'
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: %d\r\n\r\n%s" % (len(error), error))
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer_500, "127.0.0.1", 0)
    endpoint = Endpoint(id="fails", base_url=f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", region="eu-west")
    heard: list[BackendUnavailable] = []
    async with server:
        with pytest.raises(BackendUnavailable):
            await client.stream_with_failover([endpoint, dead], body(), heard.append)  # type: ignore[arg-type]
    assert [(e.endpoint_id, e.answered) for e in heard] == [("fails", True), ("dead", False)]


def text_event(text: str) -> str:
    return json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": None}]})


async def test_events_that_arrive_together_are_one_batch(client: BackendClient) -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 3}
    server, endpoint = await serve_at_once([text_event("a"), text_event("b"), text_event("c"),
                                            json.dumps({"choices": [], "usage": usage})])
    async with server:
        batches = [batch async for batch in client.stream_completion_batches(endpoint, body())]
        assert [[chunk.text for chunk in batch] for batch in batches] == [["a", "b", "c", ""]]
        assert [chunk.text for chunk in await collect(client.stream_completion(endpoint, body()))] == ["a", "b", "c", ""]


async def test_a_bad_event_breaks_the_stream_after_the_good_ones_before_it(client: BackendClient) -> None:
    server, endpoint = await serve_at_once([text_event("a"), text_event("b"), "{not json"])
    async with server:
        batches = client.stream_completion_batches(endpoint, body())
        assert [chunk.text for chunk in await anext(batches)] == ["a", "b"]
        with pytest.raises(BackendStreamBroken, match="invalid SSE payload") as caught:
            await anext(batches)
        assert caught.value.answered  # the backend answered, badly: maybe the request's own doing
        seen: list[str] = []
        with pytest.raises(BackendStreamBroken):
            async for chunk in client.stream_completion(endpoint, body()):
                seen.append(chunk.text)
        assert seen == ["a", "b"]


async def test_a_backend_that_stalls_after_done_is_cut_off(client: BackendClient) -> None:
    async with CountingSSEServer(after_done="stall") as server:
        start = time.perf_counter()
        chunks = await collect(client.stream_completion(server.endpoint, body()))
        assert time.perf_counter() - start < DRAIN_TIMEOUT_S + 2.0
        assert chunks[-1].usage is not None
        await collect(client.stream_completion(server.endpoint, body()))
        assert server.accepted == 2  # the stalled connection was not reused


async def test_closing_a_stream_early_drops_its_connection(client: BackendClient) -> None:
    async with CountingSSEServer(hold_after_first=True) as server:
        stream = client.stream_completion(server.endpoint, body())
        assert (await anext(stream)).text == "a"
        await stream.aclose()
        async with asyncio.timeout(5):
            while server.closed == 0:  # the peer saw the disconnect
                await asyncio.sleep(0.01)
        assert server.accepted == 1


async def test_past_max_connections_a_request_is_refused_at_once_and_sends_nothing() -> None:
    client = BackendClient(max_connections=1, first_byte_timeout_s=30.0)
    try:
        async with CountingSSEServer(hold_after_first=True) as server:
            held = client.stream_completion(server.endpoint, body())
            assert (await anext(held)).text == "a"
            started = time.perf_counter()
            with pytest.raises(ClientAtCapacity, match="max_connections") as caught:
                await client.stream_with_failover([server.endpoint], body())
            with pytest.raises(ClientAtCapacity):
                await client.complete(server.endpoint, body())
            assert time.perf_counter() - started < 1.0  # no wait for a free connection
            assert caught.value.endpoint_id is None and caught.value.retry_after_s is not None
            assert server.accepted == 1  # nothing reached the backend
            await held.aclose()
            again = client.stream_completion(server.endpoint, body())  # the slot is free again
            assert (await anext(again)).text == "a"
            await again.aclose()
    finally:
        await client.aclose()


async def test_endpoints_may_try_refuses_are_passed_over_and_all_refused_is_overloaded() -> None:
    client = BackendClient()
    endpoints = [Endpoint("a", f"http://127.0.0.1:{free_port()}", "r"), Endpoint("b", "http://127.0.0.1:9", "r")]
    asked: list[str] = []

    def refuse(endpoint: Endpoint) -> bool:
        asked.append(endpoint.id)
        return False

    try:
        with pytest.raises(BackendOverloaded) as caught:
            await client.stream_with_failover(endpoints, {"prompt": [1]}, may_try=refuse)
        assert asked == ["a", "b"] and caught.value.retry_after_s == 1.0  # nothing was sent anywhere
    finally:
        await client.aclose()
