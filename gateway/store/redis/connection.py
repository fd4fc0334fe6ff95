"""`RedisConnection`: what the Redis store's concerns share: one client, key names, scripts, and this
replica's lease.

Each process holds at most `redis_max_connections` connections (pool.py); a command past them waits
for one, up to `redis_timeout_s`. Redis connection failures and timeouts become `StoreUnavailable`
(`store_error`), a full Redis `StoreFull`.

In-flight counts are kept per replica, in hashes `{p}inflight:{replica}:prefill|decode` that
expire `inflight_lease_s` after the replica's last touch, and the per-tenant request slots
(`{p}slots:{tenant}`, request id -> lease end on Redis's clock) carry the same lease. A background
task (started on first use, cancelled by `aclose`) renews both every third of it, so a live
replica's long requests stay counted while a crashed replica's counts vanish within the lease;
`aclose()` deletes this replica's counts at once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store.checks import check_id
from gateway.store.errors import InvalidArgument, StoreFull, StoreUnavailable
from gateway.store.lease import LeaseTask, default_replica_id
from gateway.store.redis import scripts
from gateway.store.redis.keys import KeyNames
from gateway.store.redis.pool import PoolExhausted, WaitingConnectionPool
from gateway.store.settings import StoreSettings

P = ParamSpec("P")
R = TypeVar("R")


def store_error(exc: RedisError) -> StoreUnavailable | None:
    """The store's error for a Redis failure that is not a bug (None: let it show as one)."""
    if isinstance(exc, OutOfMemoryError):
        return StoreFull(f"Redis is full (maxmemory reached: {exc}); free memory or raise maxmemory")
    if isinstance(exc, PoolExhausted):
        return StoreUnavailable(f"Redis answers too slowly for this load ({exc}); check the server's latency, "
                                "or raise EDGERUN_REDIS_MAX_CONNECTIONS")
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return StoreUnavailable(f"Redis is unreachable ({exc}); check EDGERUN_REDIS_URL and the server")
    return None


def redis_errors(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    """A store method whose Redis failures leave it as the store's errors."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except RedisError as exc:
            converted = store_error(exc)
            if converted is None:
                raise
            raise converted from exc

    return wrapper


def ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


class RedisConnection:
    def __init__(self, settings: StoreSettings) -> None:
        """Connect lazily to `settings.redis_url`; keys are namespaced by `settings.key_prefix`."""
        if not settings.redis_url:
            raise InvalidArgument("the Redis store needs a Redis URL: set EDGERUN_REDIS_URL (or settings.redis_url)")
        self.settings = settings
        self.names = KeyNames(settings.key_prefix)
        self.replica = check_id("replica id", settings.replica_id or default_replica_id())
        # bounded; a command finding every connection busy waits for one (pool.py)
        self._pool = WaitingConnectionPool.from_url(
            settings.redis_url, decode_responses=True, max_connections=settings.redis_max_connections,
            wait_s=settings.redis_timeout_s,
            socket_timeout=settings.redis_timeout_s, socket_connect_timeout=settings.redis_timeout_s,
        )
        # decode_responses: every reply is str, which redis-py's annotations cannot express, hence Any.
        self.redis: Any = aioredis.Redis(connection_pool=self._pool)
        self._scripts: dict[str, Any] = {}
        self.held_slots: dict[str, set[str]] = {}  # tenant -> request ids this replica holds (their lease is renewed)
        self._lease = LeaseTask("edgerun-inflight-lease", self._renew_lease)

    def script(self, name: str) -> Any:
        """The registered script `scripts.<name>` (EVALSHA, loaded on first use)."""
        found = self._scripts.get(name)
        if found is None:
            found = self._scripts[name] = self.redis.register_script(getattr(scripts, name))
        return found

    @property
    def lease_ms(self) -> int:
        return ms(self.settings.inflight_lease_s)

    def inflight_keys(self) -> list[str]:
        """This replica's prefill and decode hashes, and the replica registry."""
        n = self.names
        return [n.inflight(self.replica, "prefill"), n.inflight(self.replica, "decode"), n.inflight_replicas()]

    def hold_lease(self) -> None:
        """This replica holds slots or in-flight tokens: keep renewing their lease."""
        self._lease.start()

    def holds_slot(self, tenant_id: str, request_id: str) -> None:
        self.held_slots.setdefault(tenant_id, set()).add(request_id)

    def drops_slot(self, tenant_id: str, request_id: str) -> None:
        held = self.held_slots.get(tenant_id)
        if held is not None:
            held.discard(request_id)
            if not held:
                del self.held_slots[tenant_id]

    async def _renew_lease(self) -> None:
        n = self.names
        while True:
            await asyncio.sleep(self.settings.inflight_lease_s / 3)
            try:
                async with self.redis.pipeline(transaction=False) as pipe:
                    pipe.pexpire(n.inflight(self.replica, "prefill"), self.lease_ms)
                    pipe.pexpire(n.inflight(self.replica, "decode"), self.lease_ms)
                    pipe.sadd(n.inflight_replicas(), self.replica)
                    await pipe.execute()
                for tenant_id, held in list(self.held_slots.items()):
                    await self.script("RENEW_SLOTS")(keys=[n.request_slots(tenant_id)], args=[self.lease_ms, *held])
            except RedisError:
                continue  # Redis is down (or full) for everyone; try again next period

    async def aclose(self) -> None:
        await self._lease.stop()
        try:  # our in-flight requests end with us
            await self.redis.delete(*self.inflight_keys()[:2])
            await self.redis.srem(self.names.inflight_replicas(), self.replica)
            for tenant_id, held in self.held_slots.items():
                await self.redis.zrem(self.names.request_slots(tenant_id), *held)
        except RedisError:
            pass  # the lease drops them anyway
        await self.redis.aclose()
        await self._pool.disconnect()
