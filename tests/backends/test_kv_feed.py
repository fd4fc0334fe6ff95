"""The per-consumer KV event feed (backends/server/kv_feed.py) and the event JSON it serves."""

from __future__ import annotations

import pytest

from backends.server.kv_events import to_trtllm_json
from backends.server.kv_feed import InvalidConsumer, KVEventFeed
from engines.base import KVCacheEvent
from tests.clock import Clock


def stored(event_id: int) -> KVCacheEvent:
    return KVCacheEvent(event_id, "stored", [event_id * 10], parent_hash=7, token_ids=[[1, 2, 3, 4]])


def ids(events: list[KVCacheEvent]) -> list[int]:
    return [e.event_id for e in events]


def test_one_consumer_does_not_take_events_from_another() -> None:
    feed = KVEventFeed(capacity=100, max_consumers=4, consumer_ttl_s=60)
    assert feed.read("gw-2", []) == []
    assert ids(feed.read("gw-1", [stored(0), stored(1)])) == [0, 1]
    assert ids(feed.read("gw-2", [])) == [0, 1]  # gw-1's read left them for gw-2
    assert ids(feed.read("gw-1", [stored(2)])) == [2]
    assert ids(feed.read("gw-2", [])) == [2]
    assert ids(feed.read("gw-1", [])) == [] and ids(feed.read("gw-2", [])) == []
    assert feed.read("late", []) == []  # everyone has read everything: nothing is held for a newcomer


def test_a_plain_poll_is_a_consumer_of_its_own() -> None:
    feed = KVEventFeed(capacity=100, max_consumers=4, consumer_ttl_s=60)
    feed.read("gw-1", [])
    assert ids(feed.read(None, [stored(0)])) == [0]
    assert ids(feed.read(None, [])) == []  # trtllm's drain semantics, for that caller
    assert ids(feed.read("gw-1", [])) == [0]


def test_a_new_consumer_starts_at_the_oldest_kept_event() -> None:
    feed = KVEventFeed(capacity=100, max_consumers=4, consumer_ttl_s=60)
    feed.read("gw-1", [stored(0), stored(1)])  # read by the only consumer: not kept
    feed.read("gw-1", [])
    assert ids(feed.read(None, [stored(2)])) == [2]
    assert ids(feed.read("gw-1", [])) == [2]


def test_the_ring_is_bounded_and_counts_drops() -> None:
    feed = KVEventFeed(capacity=3, max_consumers=4, consumer_ttl_s=60)
    feed.read("gw-1", [])
    assert ids(feed.read("gw-2", [stored(i) for i in range(5)])) == [2, 3, 4]
    assert feed.num_dropped == 2
    assert ids(feed.read("late", [])) == [2, 3, 4]  # kept: gw-1 has not read them yet
    assert ids(feed.read("gw-1", [])) == [2, 3, 4]
    assert feed.read("later", []) == []  # read by all: not kept


def test_silent_and_surplus_consumers_are_forgotten() -> None:
    clock = Clock(0.0)
    feed = KVEventFeed(capacity=100, max_consumers=2, consumer_ttl_s=10, clock=clock)
    feed.read("gw-1", [])
    feed.read("gw-2", [stored(0)])
    clock.now = 11.0  # gw-1 went away: it no longer holds events back
    feed.read("gw-2", [])
    assert feed.read("gw-1", []) == []  # back as a new consumer: event 0 was not kept for it
    clock.now = 12.0
    assert ids(feed.read("gw-2", [stored(1)])) == [1]  # gw-1 (last seen at 11) has not read event 1
    clock.now = 13.0
    assert ids(feed.read("gw-3", [])) == [1]  # a third consumer: the least recently seen (gw-1) is forgotten
    assert feed.read("gw-1", []) == []  # so event 1 was no longer kept for it


def test_consumer_ids_are_checked() -> None:
    feed = KVEventFeed(capacity=10, max_consumers=2, consumer_ttl_s=10)
    for bad in ("", "x" * 129, "a b", "gw\n1"):
        with pytest.raises(InvalidConsumer):
            feed.read(bad, [])


def test_events_carry_hashes_only_unless_tokens_are_enabled() -> None:
    event = stored(3)
    [block] = to_trtllm_json(event, 2048)["data"]["blocks"]
    assert block["block_hash"] == 30 and block["tokens"] == []  # TensorRT-LLM's shape, no token ids
    [block] = to_trtllm_json(event, 2048, include_tokens=True)["data"]["blocks"]
    assert [t["token_id"] for t in block["tokens"]] == [1, 2, 3, 4]
