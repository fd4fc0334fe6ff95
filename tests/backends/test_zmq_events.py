"""The KV event subscriber against real ZMQ sockets: a publisher bound on loopback (XPUB, so the
test knows when the subscriber is connected; to a SUB it is a PUB) and a replay ROUTER answering
as vLLM's (`topic, seq, payload`) or SGLang's (`seq, payload`) does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgpack
import pytest
import zmq
import zmq.asyncio

from backends.client.engine_events import BlocksRemoved, BlocksStored, EventBatch
from backends.client.zmq_events import EventSource, EventSubscriber, close_context, new_context

END = (-1).to_bytes(8, "big", signed=True)


def payload(n: int) -> bytes:
    """A batch whose one event names `n`, so the test can tell batches apart."""
    return msgpack.packb([float(n), [["BlockRemoved", [n], "GPU"]], 0])


@dataclass
class Publisher:
    """An engine's publisher: live messages, a replay buffer and a ROUTER serving it."""

    context: zmq.asyncio.Context
    topic: bytes = b"kv"
    replay_frames: int = 3  # 3: vLLM's replies, 2: SGLang's
    buffer: dict[int, bytes] = field(default_factory=dict)
    pub: zmq.asyncio.Socket | None = None
    router: zmq.asyncio.Socket | None = None
    endpoint: str = ""
    replay_endpoint: str = ""

    def open(self) -> None:
        self.pub = self.context.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.router = self.context.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.replay_endpoint = f"tcp://127.0.0.1:{port}"

    def close(self) -> None:
        for sock in (self.pub, self.router):
            if sock is not None:
                sock.close(linger=0)

    async def wait_subscribed(self) -> None:
        assert self.pub is not None
        assert (await asyncio.wait_for(self.pub.recv(), 10))[0] == 1  # a subscription message

    async def send(self, seq: int, *, live: bool = True) -> None:
        """Buffer `seq` for replay and, unless `live` is False (a message the subscriber lost), publish it."""
        self.buffer[seq] = payload(seq)
        if live:
            assert self.pub is not None
            await self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), self.buffer[seq]])

    async def serve_replay(self) -> None:
        assert self.router is not None
        while True:
            client, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            for seq in sorted(s for s in self.buffer if s >= first):
                head = [self.topic] if self.replay_frames == 3 else []
                await self.router.send_multipart([client, b"", *head, seq.to_bytes(8, "big"), self.buffer[seq]])
            await self.router.send_multipart([client, b"", *([b""] if self.replay_frames == 3 else []), END, b""])


@dataclass
class Seen:
    batches: list[int] = field(default_factory=list)  # the n of each batch, in order
    resets: list[str] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_batch(self, batch: EventBatch) -> None:
        (event,) = batch.events
        assert isinstance(event, BlocksRemoved)
        self.batches.append(int(event.block_hashes[0]))
        self.arrived.set()

    async def on_reset(self, reason: str) -> None:
        self.resets.append(reason)

    async def until(self, count: int) -> None:
        async with asyncio.timeout(10):
            while len(self.batches) < count:
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = new_context()
    yield ctx
    close_context(ctx)


@pytest.fixture
async def publishers(context: zmq.asyncio.Context) -> AsyncIterator[list[Publisher]]:
    """The test's publishers, closed at the end (a socket left to the garbage collector stays open
    in libzmq and keeps its context from closing)."""
    opened: list[Publisher] = []
    yield opened
    for publisher in opened:
        publisher.close()


def open_publisher(context: zmq.asyncio.Context, publishers: list[Publisher], replay_frames: int = 3) -> Publisher:
    publisher = Publisher(context, replay_frames=replay_frames)
    publisher.open()
    publishers.append(publisher)
    return publisher


async def follow(
    context: zmq.asyncio.Context, publisher: Publisher, *, replay: bool = True
) -> tuple[EventSubscriber, Seen, asyncio.Task[None]]:
    source = EventSource(publisher.endpoint, publisher.replay_endpoint if replay else None, topic="kv")
    subscriber, seen = EventSubscriber(source, context), Seen()
    task = asyncio.create_task(subscriber.run(seen.on_batch, seen.on_reset))
    await publisher.wait_subscribed()
    return subscriber, seen, task


async def stop(*tasks: asyncio.Task[None]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.parametrize("replay_frames", [3, 2], ids=["vllm-replay", "sglang-replay"])
async def test_lost_messages_are_replayed_in_order(
    context: zmq.asyncio.Context, publishers: list[Publisher], replay_frames: int
) -> None:
    publisher = open_publisher(context, publishers, replay_frames)
    replaying = asyncio.create_task(publisher.serve_replay())
    subscriber, seen, task = await follow(context, publisher)
    try:
        await publisher.send(0)
        await publisher.send(1)
        await seen.until(2)
        await publisher.send(2, live=False)  # lost on the way: only the replay buffer has them
        await publisher.send(3, live=False)
        await publisher.send(4)
        await seen.until(5)
        assert seen.batches == [0, 1, 2, 3, 4] and seen.resets == [] and subscriber.num_replayed == 2
    finally:
        await stop(task, replaying)


async def test_a_gap_without_replay_resets_the_stream(context: zmq.asyncio.Context, publishers: list[Publisher]) -> None:
    publisher = open_publisher(context, publishers)
    subscriber, seen, task = await follow(context, publisher, replay=False)
    try:
        await publisher.send(0)
        await seen.until(1)
        await publisher.send(1, live=False)
        await publisher.send(2)
        await seen.until(2)
        assert seen.batches == [0, 2] and len(seen.resets) == 1 and "lost" in seen.resets[0]
        assert subscriber.expected == 3
    finally:
        await stop(task)


async def test_a_replay_that_no_longer_holds_the_gap_resets(context: zmq.asyncio.Context, publishers: list[Publisher]) -> None:
    publisher = open_publisher(context, publishers)
    replaying = asyncio.create_task(publisher.serve_replay())
    _, seen, task = await follow(context, publisher)
    try:
        await publisher.send(0)
        await seen.until(1)
        await publisher.send(1, live=False)
        await publisher.send(2, live=False)
        del publisher.buffer[1]  # fell out of the engine's replay buffer
        await publisher.send(3)
        await seen.until(2)
        assert seen.batches == [0, 3] and len(seen.resets) == 1
    finally:
        await stop(task, replaying)


async def test_a_restarted_publisher_resets_the_stream(context: zmq.asyncio.Context, publishers: list[Publisher]) -> None:
    publisher = open_publisher(context, publishers)
    _, seen, task = await follow(context, publisher, replay=False)
    try:
        for seq in (0, 1, 2):
            await publisher.send(seq)
        await seen.until(3)
        await publisher.send(0)  # the counter starts again: a new process with an empty cache
        await seen.until(4)
        assert seen.batches == [0, 1, 2, 0] and len(seen.resets) == 1 and "restarted" in seen.resets[0]
    finally:
        await stop(task)


async def test_an_undecodable_payload_is_skipped(context: zmq.asyncio.Context, publishers: list[Publisher]) -> None:
    publisher = open_publisher(context, publishers)
    subscriber, seen, task = await follow(context, publisher, replay=False)
    try:
        assert publisher.pub is not None
        await publisher.pub.send_multipart([b"kv", (0).to_bytes(8, "big"), b"\xc1"])
        await publisher.send(1)
        await seen.until(1)
        assert seen.batches == [1] and subscriber.num_bad == 1 and seen.resets == []
    finally:
        await stop(task)


async def test_a_real_vllms_messages_and_replay_answer(context: zmq.asyncio.Context, publishers: list[Publisher]) -> None:
    """vLLM 0.32.0's recorded messages, the second lost on the way; its replay socket answers with
    the frames the real one sent (tests/backends/fixtures/kv_events/vllm_0_32_recorded.msgpack)."""
    from tests.backends.test_engine_events import recorded_vllm

    recorded = recorded_vllm()
    publisher = open_publisher(context, publishers)
    publisher.topic = b""

    async def replay_like_vllm() -> None:
        assert publisher.router is not None
        client, _, start = await publisher.router.recv_multipart()
        assert int.from_bytes(start, "big") == 1
        for frames in recorded["replay_from_1"]:
            await publisher.router.send_multipart([client, *frames])

    replaying = asyncio.create_task(replay_like_vllm())
    salts: list[str | None] = []

    async def on_batch(batch: EventBatch) -> None:
        (event,) = batch.events
        assert isinstance(event, BlocksStored)
        salts.append(event.salt_of_block(0))

    async def on_reset(reason: str) -> None:
        raise AssertionError(reason)

    source = EventSource(publisher.endpoint, publisher.replay_endpoint)
    subscriber = EventSubscriber(source, context)
    task = asyncio.create_task(subscriber.run(on_batch, on_reset))
    try:
        await publisher.wait_subscribed()
        assert publisher.pub is not None
        first, _, last = recorded["live"]
        await publisher.pub.send_multipart(first)
        await publisher.pub.send_multipart(last)
        async with asyncio.timeout(10):
            while len(salts) < 3:
                await asyncio.sleep(0.01)
        assert salts == ["salt-tenant-a", "salt-tenant-b", None] and subscriber.num_replayed == 1
    finally:
        await stop(task, replaying)


async def test_the_subscriber_binds_when_the_engine_connects(context: zmq.asyncio.Context) -> None:
    """vLLM connects its PUB socket to an endpoint that names a host: the gateway binds there."""
    from cli.processes import free_port

    endpoint = f"tcp://127.0.0.1:{free_port()}"
    subscriber, seen = EventSubscriber(EventSource(endpoint, bind=True), context), Seen()
    task = asyncio.create_task(subscriber.run(seen.on_batch, seen.on_reset))
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    try:
        await asyncio.sleep(0.1)  # the subscriber's bind
        pub.connect(endpoint)
        async with asyncio.timeout(10):
            while not seen.batches:  # a PUB drops what it sends before the subscription arrives
                await pub.send_multipart([b"", (len(seen.batches)).to_bytes(8, "big"), payload(5)])
                await asyncio.sleep(0.05)
        assert seen.batches[0] == 5
    finally:
        pub.close(linger=0)
        await stop(task)


async def test_a_subscription_that_cannot_bind_raises_and_leaves_no_socket(context: zmq.asyncio.Context) -> None:
    """Its socket was opened before the bind and closed only after it: each retry of a bind that fails
    (the address taken) left one more socket, with its descriptors, to the garbage collector."""
    taken = context.socket(zmq.PUB)
    taken.setsockopt(zmq.LINGER, 0)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    try:
        subscriber, seen = EventSubscriber(EventSource(f"tcp://127.0.0.1:{port}", bind=True), context), Seen()
        for _ in range(3):
            with pytest.raises(zmq.ZMQError):
                await subscriber.run(seen.on_batch, seen.on_reset)
        assert len(context._sockets) == 1  # the one holding the address
    finally:
        taken.close(linger=0)


async def test_a_replay_socket_that_cannot_be_reached_resets_and_the_stream_goes_on(
    context: zmq.asyncio.Context, publishers: list[Publisher]
) -> None:
    """ZMQ's refusal of the replay endpoint raised out of the subscription, which then lost every
    message until it was resubscribed."""
    publisher = open_publisher(context, publishers)
    source = EventSource(publisher.endpoint, "tcp://127.0.0.1", topic="kv")  # no port: ZMQ refuses it
    subscriber, seen = EventSubscriber(source, context), Seen()
    task = asyncio.create_task(subscriber.run(seen.on_batch, seen.on_reset))
    try:
        await publisher.wait_subscribed()
        await publisher.send(0)
        await seen.until(1)
        await publisher.send(1, live=False)
        await publisher.send(2)
        await publisher.send(3)
        await seen.until(3)
        assert seen.batches == [0, 2, 3] and len(seen.resets) == 1 and not task.done()
        assert len(context._sockets) == 3  # the publisher's two and the subscription's: no replay socket left
    finally:
        await stop(task)
