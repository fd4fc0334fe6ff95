"""The Redis store's connection pool: bounded, and a command that finds every connection busy waits
for one instead of failing.

redis-py's asyncio `ConnectionPool` raises `MaxConnectionsError` at once past `max_connections`
(100 by default since redis-py 8.0), which turned a burst of concurrent requests into 503s although
Redis was fine. Its `BlockingConnectionPool` waits, but takes a condition lock and arms a timer on
every command, even with connections to spare: about 10 us of CPU per command, 0.1-0.2 ms per
request. This pool takes a free connection exactly as `ConnectionPool` does and only waits (up to
`wait_s`, then `PoolExhausted`, a redis-py `ConnectionError`, which the store turns into `StoreUnavailable`)
when there is none.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError


class PoolExhausted(RedisConnectionError):
    """Every connection of the pool stayed busy for `wait_s`: Redis is slow, or the pool too small."""


class WaitingConnectionPool(aioredis.ConnectionPool):
    def __init__(self, *, wait_s: float, **kwargs: Any) -> None:
        """`kwargs` as `ConnectionPool` takes them (`max_connections` bounds the pool); `wait_s`: how long a
        command waits for a connection when all are busy."""
        super().__init__(**kwargs)
        self._wait_s = wait_s
        self._freed = asyncio.Condition()
        self._num_waiting = 0

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]  # redis-py: untyped
        except MaxConnectionsError:
            pass
        try:
            async with asyncio.timeout(self._wait_s):
                while True:
                    async with self._freed:
                        self._num_waiting += 1
                        try:
                            await self._freed.wait()
                        except BaseException:  # cancelled or timed out, maybe just as a release woke it:
                            self._freed.notify()  # pass the wake-up on, or a free connection waits for the next
                            raise
                        finally:
                            self._num_waiting -= 1
                    try:
                        return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]  # redis-py: untyped
                    except MaxConnectionsError:
                        continue  # another command took it first
        except TimeoutError as exc:
            raise PoolExhausted(
                f"no Redis connection came free within {self._wait_s} s (all {self.max_connections} busy)"
            ) from exc

    async def release(self, connection: Any) -> None:
        await super().release(connection)
        if self._num_waiting:
            async with self._freed:
                self._freed.notify()
