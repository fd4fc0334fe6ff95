"""Subscribe to one engine's KV event stream (vLLM's or SGLang's ZMQ publisher), without gaps.

Who binds: both engines bind their PUB socket when its endpoint has a wildcard host (`tcp://*:5557`)
or is `ipc://`, and connect to it otherwise; the subscriber does the opposite (`EventSource.bind`).
Letting the engine bind is what lets several gateway replicas subscribe to one engine.

The engine's PUB socket sends `topic, seq, payload` (seq: 8-byte big-endian, counting from 0
when the publisher starts). ZMQ drops messages when a subscriber falls behind its high-water
mark and delivers nothing sent before it connected, so `EventSubscriber` checks every seq:

- the next expected one: handed on;
- a jump ahead (messages were lost): the missing ones are asked of the engine's replay socket
  when one is configured (a ROUTER: send the first missing seq as 8 big-endian bytes; it answers
  with every buffered message from there, `topic, seq, payload` from vLLM or `seq, payload` from
  SGLang, then an end marker whose seq is -1), and handed on in order before the message that
  showed the gap. Without a replay socket, or when it cannot be reached, no longer holds the first
  missing message or does not answer in time, the stream cannot be trusted: `on_reset` is called
  and the stream starts afresh from the message that showed the gap;
- a seq lower than expected: the publisher restarted (its counter starts at 0 again, and its
  cache is empty): `on_reset`, then the message.

The first message after connecting is taken as it comes (there is nothing to compare it with).
Payloads are decoded here (`backends.client.engine_events`); one that cannot be decoded is
logged and skipped. Everything runs on the caller's event loop (zmq.asyncio); cancelling `run`
closes the sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog
import zmq
import zmq.asyncio

from backends.client.engine_events import BadEventPayload, EventBatch, decode_batch

log = structlog.get_logger("edgerun.backends.zmq_events")

END_SEQ = -1  # the replay socket's end marker, as a signed 8-byte integer
REPLAY_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class EventSource:
    """Where one engine publishes: its PUB endpoint, optionally its replay ROUTER and a topic prefix."""

    endpoint: str  # e.g. "tcp://10.0.0.5:5557"
    replay_endpoint: str | None = None
    topic: str = ""
    # Which side binds the PUB/SUB pair. vLLM and SGLang bind an endpoint with a wildcard host
    # ("tcp://*:5557") or an ipc:// one, and *connect* to any other: then the subscriber binds.
    bind: bool = False


class EventSubscriber:
    """Reads one `EventSource`; `run(on_batch, on_reset)` until cancelled.

    `on_batch(batch)` gets every batch in seq order; `on_reset(reason)` is called before the
    first batch after events were lost for good or the publisher restarted: whatever the caller
    built from earlier batches is stale then.
    """

    def __init__(self, source: EventSource, context: zmq.asyncio.Context) -> None:
        self.source = source
        self._context = context
        self.expected: int | None = None  # the next seq; None until the first message
        self.num_replayed = 0
        self.num_resets = 0
        self.num_bad = 0

    async def run(
        self,
        on_batch: Callable[[EventBatch], Awaitable[None]],
        on_reset: Callable[[str], Awaitable[None]],
    ) -> None:
        sub = self._context.socket(zmq.SUB)
        try:  # closed however it ends, a failed bind (the address taken) too: not left to the garbage collector
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.SUBSCRIBE, self.source.topic.encode())
            if self.source.bind:
                sub.bind(self.source.endpoint)
            else:
                sub.connect(self.source.endpoint)
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    self.num_bad += 1
                    continue
                _, seq_bytes, payload = frames
                seq = int.from_bytes(seq_bytes, "big")
                await self._take(seq, payload, on_batch, on_reset)
        finally:
            sub.close(linger=0)

    async def _take(
        self,
        seq: int,
        payload: bytes,
        on_batch: Callable[[EventBatch], Awaitable[None]],
        on_reset: Callable[[str], Awaitable[None]],
    ) -> None:
        expected = self.expected
        if expected is not None and seq < expected:
            await self._reset(on_reset, f"seq went back from {expected} to {seq}: the publisher restarted")
        elif expected is not None and seq > expected:
            missed = await self._replay(expected, seq)
            if missed is None:
                await self._reset(on_reset, f"messages {expected}..{seq - 1} were lost and could not be replayed")
            else:
                self.num_replayed += len(missed)
                for payload_missed in missed:
                    await self._deliver(payload_missed, on_batch)
        self.expected = seq + 1
        await self._deliver(payload, on_batch)

    async def _reset(self, on_reset: Callable[[str], Awaitable[None]], reason: str) -> None:
        self.num_resets += 1
        log.warning("kv event stream reset", endpoint=self.source.endpoint, reason=reason)
        await on_reset(reason)

    async def _deliver(self, payload: bytes, on_batch: Callable[[EventBatch], Awaitable[None]]) -> None:
        try:
            batch = decode_batch(payload)
        except BadEventPayload as exc:
            self.num_bad += 1
            log.warning("kv event batch skipped", endpoint=self.source.endpoint, error=str(exc))
            return
        await on_batch(batch)

    async def _replay(self, first: int, stop: int) -> list[bytes] | None:
        """The payloads of seq `first` .. `stop - 1` from the replay socket, or None when it cannot
        give them all (none configured, none reachable, no answer in time, or `first` no longer buffered)."""
        if self.source.replay_endpoint is None:
            return None
        dealer = self._context.socket(zmq.DEALER)
        found: dict[int, bytes] = {}
        try:
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(self.source.replay_endpoint)
            async with asyncio.timeout(REPLAY_TIMEOUT_S):
                await dealer.send_multipart([b"", first.to_bytes(8, "big")])
                while True:
                    frames = await dealer.recv_multipart()
                    if frames and frames[0] == b"":  # the ROUTER's empty delimiter
                        frames = frames[1:]
                    if len(frames) not in (2, 3):  # vLLM: topic, seq, payload; SGLang: seq, payload
                        continue
                    seq = int.from_bytes(frames[-2], "big", signed=True)
                    if seq == END_SEQ:
                        break
                    if first <= seq < stop:
                        found[seq] = frames[-1]
        except TimeoutError:
            log.warning("kv event replay timed out", endpoint=self.source.replay_endpoint, first=first)
            return None
        except zmq.ZMQError as exc:  # e.g. an endpoint ZMQ refuses: the gap is lost, not the stream
            log.warning("kv event replay failed", endpoint=self.source.replay_endpoint, first=first, error=str(exc))
            return None
        finally:
            dealer.close(linger=0)
        if len(found) != stop - first:
            return None
        return [found[seq] for seq in range(first, stop)]


def new_context() -> zmq.asyncio.Context:
    """A ZMQ context for the subscribers of one event loop (close it with `close_context`)."""
    return zmq.asyncio.Context()


def close_context(context: zmq.asyncio.Context) -> None:
    """Close every socket still open on `context` at once, and the context."""
    with contextlib.suppress(zmq.ZMQError):
        context.destroy(linger=0)
