"""gateway/store/redis_pool.py on a real Redis: commands past the pool's connections wait for one and all
succeed; a command that finds none free within `wait_s` fails with PoolExhausted (a redis-py
ConnectionError, which the store turns into StoreUnavailable)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from gateway.store.redis_pool import PoolExhausted, WaitingConnectionPool


async def test_commands_past_the_connections_wait_and_succeed(redis_url: str) -> None:
    pool = WaitingConnectionPool.from_url(redis_url, max_connections=2, wait_s=5.0)
    client = aioredis.Redis(connection_pool=pool)
    try:
        answers = await asyncio.gather(*(client.echo(str(i)) for i in range(40)))
        assert answers == [str(i).encode() for i in range(40)]
        assert len(pool._in_use_connections) + len(pool._available_connections) <= 2
    finally:
        await client.aclose()
        await pool.disconnect()


async def test_a_command_that_finds_no_connection_in_time_fails(redis_url: str) -> None:
    pool = WaitingConnectionPool.from_url(redis_url, max_connections=1, wait_s=0.2)
    client = aioredis.Redis(connection_pool=pool)
    held = await pool.get_connection()
    try:
        with pytest.raises(PoolExhausted, match="no Redis connection came free"):
            await client.ping()
        await pool.release(held)
        assert await client.ping() is True  # free again: served at once
    finally:
        await client.aclose()
        await pool.disconnect()
