"""KV cache events for several readers: a bounded ring with one cursor per consumer.

TensorRT-LLM's `POST /kv_cache_events` drains: whoever polls first takes the events, so two
gateway replicas (or anyone else) polling one backend would each see only part of them, and the
prefix index of each would miss blocks. Here every poll names its consumer (the gateway sends
its replica id; a plain poll without one is the consumer `None`, which keeps trtllm's drain
semantics for that caller) and gets the events it has not read yet.

- The ring keeps an event until every live consumer has read it, and at most `capacity` events:
  past that the oldest are dropped (`num_dropped`, exported in /metrics) and a slow consumer
  misses them, as it would with trtllm-serve's own bounded queue.
- A new consumer starts at the oldest event still kept.
- A consumer silent for `consumer_ttl_s` is forgotten (it no longer holds events back); at most
  `max_consumers` are remembered, and a new one beyond that replaces the least recently seen.

Used only on the server's event loop (the engine's own log is the thread-safe hand-off).
"""

from __future__ import annotations

import logging
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

from engines.base import KVCacheEvent

log = logging.getLogger("edgerun.backend")
_CONSUMER_ID = re.compile(r"[A-Za-z0-9_.:@\-]{1,128}")


class InvalidConsumer(ValueError):
    """A consumer id that is empty, too long or has characters outside [A-Za-z0-9_.:@-]."""


@dataclass(slots=True)
class _Cursor:
    next_seq: int  # the sequence number of the next event this consumer reads
    seen_at: float


class KVEventFeed:
    def __init__(
        self, capacity: int, max_consumers: int, consumer_ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._events: deque[KVCacheEvent] = deque()
        self._first_seq = 0  # sequence number of self._events[0]
        self._capacity = capacity
        self._max_consumers = max_consumers
        self._ttl_s = consumer_ttl_s
        self._clock = clock
        self._cursors: dict[str | None, _Cursor] = {}
        self.num_dropped = 0

    def read(self, consumer: str | None, incoming: list[KVCacheEvent]) -> list[KVCacheEvent]:
        """Add `incoming` (just drained from the engine), then return what `consumer` has not read."""
        if consumer is not None and not _CONSUMER_ID.fullmatch(consumer):
            raise InvalidConsumer(
                "consumer must be 1-128 characters from A-Z a-z 0-9 _ . : @ - (the gateway sends its replica id)"
            )
        self._append(incoming)
        now = self._clock()
        self._forget_silent(now)
        cursor = self._cursors.get(consumer)
        if cursor is None:
            cursor = self._admit(consumer, now)
        start = max(cursor.next_seq, self._first_seq)
        events = list(islice(self._events, start - self._first_seq, None))
        cursor.next_seq, cursor.seen_at = self._first_seq + len(self._events), now
        self._trim()
        return events

    def _append(self, incoming: list[KVCacheEvent]) -> None:
        self._events.extend(incoming)
        overflow = len(self._events) - self._capacity
        for _ in range(max(0, overflow)):
            self._events.popleft()
        if overflow > 0:
            self._first_seq += overflow
            self.num_dropped += overflow

    def _forget_silent(self, now: float) -> None:
        for consumer in [c for c, cursor in self._cursors.items() if now - cursor.seen_at > self._ttl_s]:
            del self._cursors[consumer]

    def _admit(self, consumer: str | None, now: float) -> _Cursor:
        if len(self._cursors) >= self._max_consumers:
            oldest = min(self._cursors, key=lambda c: self._cursors[c].seen_at)
            log.warning("kv events: more than %d consumers; forgetting %r", self._max_consumers, oldest)
            del self._cursors[oldest]
        cursor = self._cursors[consumer] = _Cursor(self._first_seq, now)
        return cursor

    def _trim(self) -> None:
        """Drop the events every remembered consumer has read."""
        if not self._cursors:
            return
        read_by_all = min(cursor.next_seq for cursor in self._cursors.values()) - self._first_seq
        for _ in range(max(0, read_by_all)):
            self._events.popleft()
        self._first_seq += max(0, read_by_all)
