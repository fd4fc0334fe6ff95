"""A Redis budget reservation whose admit failed (timed out, connection lost) but that Redis applies
late is taken back; one that reaches Redis after its undo applies nothing (gateway/store/redis/undo.py).
Before, the worst case stayed in the month's spend for good and refused the tenant early."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from gateway.store import Store, open_store
from gateway.store.errors import StoreUnavailable
from gateway.store.redis import scripts as redis_scripts
from gateway.store.settings import StoreSettings
from tests.gateway.e2e.test_store_pause import debug_command_option
from tests.gateway.redis_server import EPHEMERAL, start_redis
from tests.gateway.store.calls import reserve_budget

pytestmark = pytest.mark.process

MONTH = "2026-11"


@pytest.fixture
def debug_redis(tmp_path: Path) -> Iterator[str]:
    server = start_redis(tmp_path, [*EPHEMERAL, *debug_command_option()])
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop(timeout_s=10)


def sleep_redis(url: str, seconds: float) -> threading.Thread:
    """DEBUG SLEEP from another client: Redis answers no one for `seconds` (it has begun on return)."""
    def run() -> None:
        with redis.Redis.from_url(url, socket_timeout=seconds + 10) as admin:
            admin.execute_command("DEBUG", "SLEEP", str(seconds))

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.15)
    return thread


def pause_redis(url: str, seconds: float) -> None:
    """CLIENT PAUSE from another client: Redis answers no other command for `seconds`, from the moment this returns."""
    with redis.Redis.from_url(url, socket_timeout=10) as admin:
        admin.execute_command("CLIENT", "PAUSE", str(int(seconds * 1000)), "ALL")


async def settled_spend(store: Store, want: int, timeout_s: float = 10.0) -> int:
    """The spend once the store's undo queue is empty (or `timeout_s` passed)."""
    deadline = time.monotonic() + timeout_s
    while store.admission._undo.pending and time.monotonic() < deadline:  # type: ignore[attr-defined]
        await asyncio.sleep(0.05)
    return await store.admission.budget_spent("t1", MONTH)


async def test_a_reservation_that_timed_out_and_lands_late_is_given_back(debug_redis: str) -> None:
    store = open_store(StoreSettings(redis_url=debug_redis, redis_timeout_s=0.3, key_prefix="late:"))
    try:
        assert (await reserve_budget(store, "t1", MONTH, 10, None)).spent_micro == 10
        sleeping = sleep_redis(debug_redis, 1.0)  # longer than the store's timeout
        with pytest.raises(StoreUnavailable):
            await reserve_budget(store, "t1", MONTH, 100, 1000)
        await asyncio.to_thread(sleeping.join)  # now Redis runs what waited: the reservation, its undo
        assert await settled_spend(store, 10) == 10
        await asyncio.sleep(0.3)
        assert await store.admission.budget_spent("t1", MONTH) == 10  # and nothing lands after
        # the budget is whole again: the rest of it can be reserved
        assert (await reserve_budget(store, "t1", MONTH, 990, 1000)).allowed
    finally:
        await store.aclose()


def run_reserve(client: redis.Redis, token: str, amount: int, budget: int | str = "") -> list[int]:
    """ADMIT asked for a reservation only -> [admitted 1/0, spent]."""
    keys = ["late2:slots:t1", "late2:budget:t1:" + MONTH, "late2:budget_token:" + token, "late2:inflight:r:prefill",
            "late2:inflight:r:decode", "late2:inflight_replicas"]
    args = ["req", "", 15_000, "", 60_000, "", 0, "late2:rl:k:tpm", amount, budget, 3600, 900, "", 0, 0, "r"]
    outcome, _, spent = client.eval(redis_scripts.ADMIT, len(keys), *keys, *args)  # type: ignore[misc]
    return [int(outcome == 0), int(spent)]


def run_undo(client: redis.Redis, *tokens: str) -> None:
    keys = [k for t in tokens for k in ("late2:budget:t1:" + MONTH, "late2:budget_token:" + t)]
    client.eval(redis_scripts.UNDO_RESERVATIONS, len(keys), *keys, 900)


def spend(client: redis.Redis) -> int:
    return int(client.get("late2:budget:t1:" + MONTH) or 0)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url, decode_responses=True) as c:
        c.delete(*c.keys("late2:*") or ["late2:none"])
        yield c
        c.delete(*c.keys("late2:*") or ["late2:none"])


def test_a_reservation_that_reaches_redis_after_its_undo_applies_nothing(client: redis.Redis) -> None:
    assert run_reserve(client, "a", 10) == [1, 10]
    run_undo(client, "b")  # b's call failed before Redis saw it
    assert run_reserve(client, "b", 100) == [0, 10]  # then it arrives
    assert spend(client) == 10
    assert client.ttl("late2:budget_token:b") > 0  # the tombstone expires


def test_undo_and_a_resent_reservation_change_nothing_twice(client: redis.Redis) -> None:
    assert run_reserve(client, "a", 10) == [1, 10]
    assert run_reserve(client, "b", 100, 1000) == [1, 110]
    assert run_reserve(client, "b", 100, 1000) == [1, 110]  # the same call again: applied once
    run_undo(client, "b")
    run_undo(client, "b")
    assert spend(client) == 10
    assert client.get("late2:budget_token:b") == "undone"
    client.set("late2:budget:t1:" + MONTH, 30)  # settled meanwhile below the amount: never below 0
    assert run_reserve(client, "c", 50) == [1, 80]
    client.set("late2:budget:t1:" + MONTH, 20, keepttl=True)
    run_undo(client, "c")
    assert spend(client) == 0
    assert client.ttl("late2:budget:t1:" + MONTH) > 0  # the counter keeps its expiry


async def test_a_cancelled_caller_is_given_back_once_not_also_undone(debug_redis: str) -> None:
    # The admitter shields the store's call from a caller that leaves: it completes (no timeout), the
    # admitter gives the reservation back, and the store queues no undo; the two must never both take it back.
    from gateway.billing.metering import Metering
    from gateway.metrics import GatewayMetrics
    from gateway.pipeline.concurrency import TenantSlots
    from gateway.pipeline.ticket import Admitter
    from tests.gateway.billing.test_metering import PRICES, request_for

    store = open_store(StoreSettings(redis_url=debug_redis, redis_timeout_s=2.0, key_prefix="late3:"))
    try:
        request = await request_for(store, budget=10_000)
        month = time.strftime("%Y-%m", time.gmtime(request.ctx.arrived_at))
        await reserve_budget(store, "ta", month, 50, None)
        admitter = Admitter(store.admission, Metering(store, PRICES, GatewayMetrics()), TenantSlots(None))
        pause_redis(debug_redis, 0.8)  # shorter than the timeout: the call is slow, not failed
        paused_until = time.monotonic() + 0.8
        caller = asyncio.create_task(admitter.admit(request, request.prompt_tokens, 100))
        await asyncio.sleep(0.1)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        await asyncio.sleep(max(0.0, paused_until - time.monotonic()) + 0.1)
        await admitter.aclose()
        assert store.admission._undo.pending == 0  # type: ignore[attr-defined]
        assert await store.admission.budget_spent("ta", month) == 50  # given back once (twice would leave 0)
    finally:
        await store.aclose()
