"""ReservationUndo's bounds: it retries until Redis answers, gives up on old tokens, and stops at close."""

from __future__ import annotations

import asyncio

from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.redis.undo import ReservationUndo


class FlakyRedis:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[list[str]] = []

    async def undo(self, keys: list[str]) -> None:
        self.calls.append(keys)
        if len(self.calls) <= self.failures:
            raise RedisTimeoutError("Timeout reading from socket")


async def test_it_retries_until_redis_answers_then_goes_idle() -> None:
    redis = FlakyRedis(failures=3)
    undo = ReservationUndo(redis.undo, first_delay_s=0.001, max_delay_s=0.004)
    undo.add("spend", "token-a")
    undo.add("spend", "token-b")
    for _ in range(200):
        if not undo.pending:
            break
        await asyncio.sleep(0.005)
    assert undo.pending == 0
    assert len(redis.calls) == 4 and redis.calls[-1] == ["spend", "token-a", "spend", "token-b"]
    await undo.aclose(1.0)


async def test_it_gives_up_on_old_tokens_and_stops_at_close() -> None:
    now = [0.0]
    redis = FlakyRedis(failures=10**6)
    undo = ReservationUndo(redis.undo, first_delay_s=0.001, max_delay_s=0.002, give_up_after_s=60, clock=lambda: now[0])
    undo.add("spend", "old")
    now[0] = 50.0
    undo.add("spend", "young")
    now[0] = 61.0
    for _ in range(200):
        if undo.pending == 1:
            break
        await asyncio.sleep(0.005)
    assert undo.pending == 1  # "old" dropped (logged), "young" still tried
    loop = asyncio.get_running_loop()
    started = loop.time()
    await undo.aclose(0.05)  # Redis never answers: close waits its bound, then stops the task
    assert loop.time() - started < 1.0
    tries = len(redis.calls)
    await asyncio.sleep(0.02)
    assert len(redis.calls) == tries
    undo.add("spend", "after-close")  # refused (logged): nothing runs after close
    assert undo.pending == 1
