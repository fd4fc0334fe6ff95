"""The batch queue (gateway/store/queue.py), once per backend: all or nothing at enqueue, one claim per
item under a lease, a lapsed lease's item claimed again, the first answer wins, answers in order,
per-tenant bounds and isolation, answers kept for a while; a waiting worker woken by an enqueue (on
Redis, another replica's) or an item given back at once, and otherwise by its timeout only."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from gateway.store import InvalidArgument, Store
from gateway.store.queue import NewBatch
from tests.gateway.store.conftest import OpenStore


def batch(batch_id: str, n: int, tenant_id: str = "acme") -> NewBatch:
    items = tuple(json.dumps({"prompt": f"item {i}"}) for i in range(n))
    return NewBatch(batch_id, tenant_id, "acct1", "key_1", "@cf/test/model", items)


async def test_items_are_claimed_once_in_order_and_answered_in_order(store: Store) -> None:
    q = store.queue
    assert await q.enqueue(batch("b1", 3), max_queued=10, max_bytes=10_000)
    assert (await q.state("acme", "b1")).status == "queued"  # type: ignore[union-attr]
    claimed = [await q.claim(30) for _ in range(4)]
    assert claimed[3] is None  # three items, each claimed once
    items = [c for c in claimed if c is not None]
    assert [(c.batch_id, c.index, c.attempt) for c in items] == [("b1", 0, 1), ("b1", 1, 1), ("b1", 2, 1)]
    assert json.loads(items[1].payload) == {"prompt": "item 1"}
    assert (items[0].tenant_id, items[0].account_id, items[0].key_id, items[0].model) == (
        "acme", "acct1", "key_1", "@cf/test/model")
    assert items[2].request_id == "b1.2"
    assert (await q.state("acme", "b1")).status == "running"  # type: ignore[union-attr]
    for item in reversed(items):  # answered out of order, read back in order
        assert await q.complete(item, f"answer {item.index}", keep_s=60)
        assert await q.queued_items("acme") == (item.index, 20 * item.index)  # {"prompt": "item i"}: 20 bytes
    state = await q.state("acme", "b1")
    assert state is not None and state.status == "done" and state.model == "@cf/test/model"
    assert state.results == ("answer 0", "answer 1", "answer 2")
    assert await q.claim(30) is None


async def test_a_lapsed_lease_is_claimed_again_and_the_first_answer_wins(store: Store) -> None:
    q = store.queue
    await q.enqueue(batch("b2", 1), max_queued=10, max_bytes=10_000)
    first = await q.claim(0.3)
    assert first is not None and await q.claim(0.3) is None  # leased
    await asyncio.sleep(0.45)  # the worker died: its lease lapses
    second = await q.claim(30)
    assert second is not None and (second.index, second.attempt) == (0, 2) and second.token != first.token
    assert not await q.renew(first, 30)  # the old claim is no longer the item's
    await q.release(first, 0)  # nor can it give the item back
    assert await q.claim(30) is None
    assert await q.renew(second, 30)
    assert await q.complete(first, "late answer", keep_s=60)  # an answer is an answer: the first one stored wins
    assert not await q.complete(second, "second answer", keep_s=60)
    state = await q.state("acme", "b2")
    assert state is not None and state.results == ("late answer",)
    assert await q.queued_items("acme") == (0, 0)


async def test_release_gives_the_item_back_for_later_under_a_new_request_id(store: Store) -> None:
    q = store.queue
    await q.enqueue(batch("b3", 2), max_queued=10, max_bytes=10_000)
    item = await q.claim(30)
    assert item is not None
    await q.release(item, 0.3)  # busy: back in a while, behind what is ready
    other = await q.claim(30)
    assert other is not None and other.index == 1
    assert await q.claim(30) is None
    await asyncio.sleep(0.4)
    again = await q.claim(30)
    assert again is not None and (again.index, again.attempt, again.released) == (0, 2, 1)
    assert (item.request_id, again.request_id) == ("b3.0", "b3.0.r1")  # a refused try's record is not the answer's


async def test_limits_hold_per_tenant_and_all_or_nothing(store: Store) -> None:
    q = store.queue
    assert await q.enqueue(batch("a1", 3), max_queued=5, max_bytes=10_000)
    assert not await q.enqueue(batch("a2", 3), max_queued=5, max_bytes=10_000)  # 6 > 5: nothing queued
    assert await q.queued_items("acme") == (3, 60)
    assert not await q.enqueue(batch("a4", 1), max_queued=5, max_bytes=79)  # 60 + 20 bytes > 79
    assert await q.enqueue(batch("a5", 1), max_queued=5, max_bytes=80)
    assert await q.queued_items("acme") == (4, 80)
    item = await q.claim(30)
    assert item is not None and await q.complete(item, "answered", keep_s=60)
    assert await q.queued_items("acme") == (3, 60)  # an answered item's request no longer counts
    assert await q.state("acme", "a2") is None
    assert await q.enqueue(batch("o1", 5, tenant_id="other"), max_queued=5, max_bytes=10_000)  # its own bound
    assert await q.enqueue(batch("a3", 2), max_queued=5, max_bytes=10_000)  # 3 + 2
    with pytest.raises(InvalidArgument):
        await q.enqueue(batch("a3", 1), max_queued=50, max_bytes=10_000)  # an id is queued once
    with pytest.raises(InvalidArgument, match="batch id"):
        await q.state("acme", "a:1")  # alike in both stores, though Redis alone builds keys from it
    assert await q.state("other", "a1") is None  # another tenant's batch does not exist for it
    assert await q.state("acme", "o1") is None


async def test_answers_expire_after_keep_s(store: Store) -> None:
    q = store.queue
    await q.enqueue(batch("e1", 1), max_queued=5, max_bytes=10_000)
    item = await q.claim(30)
    assert item is not None and await q.complete(item, "x", keep_s=0.3)
    assert (await q.state("acme", "e1")) is not None
    await asyncio.sleep(0.45)
    await q.expire()
    assert await q.state("acme", "e1") is None


async def test_queued_work_survives_reopening_the_store(open_instance: OpenStore) -> None:
    first = open_instance()
    await first.queue.enqueue(batch("d1", 2), max_queued=5, max_bytes=10_000)
    held = await first.queue.claim(0.3)
    assert held is not None
    await first.aclose()  # a restart (the claim's worker is gone with it)
    again = open_instance()
    await asyncio.sleep(0.45)
    claimed = [await again.queue.claim(30), await again.queue.claim(30)]
    assert sorted((c.index, c.attempt) for c in claimed if c is not None) == [(0, 2), (1, 1)]


async def test_concurrent_claims_from_two_instances_take_each_item_once(open_instance: OpenStore) -> None:
    a, b = open_instance(), open_instance()  # local: two connections to one file
    await a.queue.enqueue(batch("c1", 40), max_queued=100, max_bytes=10_000)
    claims = await asyncio.gather(*(s.queue.claim(30) for s in [a, b] * 25))
    indexes = [c.index for c in claims if c is not None]
    assert sorted(indexes) == list(range(40))


async def test_claims_go_round_the_tenants(store: Store) -> None:
    q = store.queue
    assert await q.enqueue(batch("big", 50, tenant_id="a"), max_queued=100, max_bytes=10_000)
    assert await q.enqueue(batch("small", 2, tenant_id="b"), max_queued=100, max_bytes=10_000)  # queued after a's 50
    first = [await q.claim(30) for _ in range(4)]
    assert [(c.tenant_id, c.index) for c in first if c is not None] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    for item in first:  # b has nothing left: a's items come one after the other
        assert item is not None and await q.complete(item, "answered", keep_s=60)
    rest = [await q.claim(30) for _ in range(3)]
    assert [(c.tenant_id, c.index) for c in rest if c is not None] == [("a", 2), ("a", 3), ("a", 4)]
    assert await q.enqueue(batch("late", 1, tenant_id="b"), max_queued=100, max_bytes=10_000)  # b comes back
    assert {(c.tenant_id, c.batch_id) for c in [await q.claim(30), await q.claim(30)] if c is not None} == {
        ("a", "big"), ("b", "late")}


async def test_a_tenant_past_the_first_turns_is_reached(store: Store) -> None:
    q = store.queue
    for t in range(20):  # more tenants than a claim looks at, each with one item claimed and running
        assert await q.enqueue(batch(f"t{t}", 2, tenant_id=f"t{t}"), max_queued=100, max_bytes=10_000)
    claimed = [await q.claim(30) for _ in range(40)]
    assert sorted((c.tenant_id, c.index) for c in claimed if c is not None) == sorted(
        (f"t{t}", i) for t in range(20) for i in range(2))
    assert await q.enqueue(batch("last", 1, tenant_id="late"), max_queued=100, max_bytes=10_000)
    found = [await q.claim(30) for _ in range(3)]  # looking further after each claim that found none
    assert [c.batch_id for c in found if c is not None] == ["last"]


async def test_depth_counts_queued_and_running_items(store: Store) -> None:
    q = store.queue
    assert await q.depth() == (0, 0)
    await q.enqueue(batch("q1", 3), max_queued=10, max_bytes=10_000)
    await q.enqueue(batch("q2", 1, tenant_id="other"), max_queued=10, max_bytes=10_000)
    first, second = await q.claim(30), await q.claim(0.2)
    assert first is not None and second is not None and await q.depth() == (2, 2)
    await q.release(first, 30)  # given back: waiting, not running
    assert not await q.renew(first, 30)  # its claim ended
    assert await q.depth() == (3, 1)
    await asyncio.sleep(0.3)  # second's lease lapsed: its worker is gone, the item waits again
    assert await q.depth() == (4, 0)
    again = await q.claim(30)
    assert again is not None and await q.complete(again, "x", keep_s=60)
    assert await q.depth() == (3, 0)



async def test_an_enqueue_or_an_item_given_back_at_once_wakes_a_waiting_worker(pair: tuple[Store, Store]) -> None:
    worker, other = pair[0].queue, pair[1].queue  # local: one instance; Redis: another replica enqueues
    started = time.monotonic()
    await worker.wait_for_work(0.3)  # nothing announced: it waits its timeout
    assert 0.25 < time.monotonic() - started < 2.0
    waiting = asyncio.create_task(worker.wait_for_work(30))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    enqueued = time.monotonic()
    assert await other.enqueue(batch("w1", 2), max_queued=10, max_bytes=10_000)
    await asyncio.wait_for(waiting, 5)
    assert time.monotonic() - enqueued < 1.0  # at once, not after its 30 s
    first, second = await worker.claim(30), await worker.claim(30)
    assert first is not None and second is not None

    waiting = asyncio.create_task(worker.wait_for_work(30))
    await asyncio.sleep(0.2)
    await other.release(first, 60)  # given back for later: nobody is woken (its worker keeps its own time)
    await asyncio.sleep(0.3)
    assert not waiting.done()
    released = time.monotonic()
    await other.release(second, 0)  # at once (its worker is shutting down): claimable now, and announced
    await asyncio.wait_for(waiting, 5)
    assert time.monotonic() - released < 1.0
    found = await worker.claim(30)
    assert found is not None and found.index == second.index
