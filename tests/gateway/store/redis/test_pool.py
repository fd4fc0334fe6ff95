"""gateway/store/redis/pool.py on a real Redis: commands past the pool's connections wait for one and all
succeed; a command that finds none free within `wait_s` fails with PoolExhausted (a redis-py
ConnectionError, which the store turns into StoreUnavailable)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from gateway.store.redis.pool import PoolExhausted, WaitingConnectionPool


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


async def test_a_waiter_cancelled_as_a_release_wakes_it_passes_the_wake_up_on(redis_url: str) -> None:
    """A client that leaves (its task cancelled) just after a release woke its command: the next waiter
    gets the connection, rather than waiting for another release (here: none) until its `wait_s`."""
    pool = WaitingConnectionPool.from_url(redis_url, max_connections=1, wait_s=5.0)
    held = await pool.get_connection()
    first, second = asyncio.ensure_future(pool.get_connection()), asyncio.ensure_future(pool.get_connection())
    try:
        await asyncio.sleep(0.05)  # both wait
        await pool.release(held)  # wakes `first`, which has not run yet
        first.cancel()
        connection = await asyncio.wait_for(second, 2.0)
        await pool.release(connection)
        assert first.cancelled()
    finally:
        await pool.disconnect()
