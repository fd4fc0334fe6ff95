"""`RedisRouting`: sessions, the prefix index and in-flight tokens in Redis, each call one script.

Sessions and prefix entries expire on their own (PX); in-flight tokens are per replica, under its
lease (connection.py). `lookup` reads the three in one script, `started` writes in one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from gateway.store.admission import Inflight
from gateway.store.checks import check_hashes, check_text, check_tokens
from gateway.store.models import to_us
from gateway.store.redis.connection import RedisConnection, ms, redis_errors
from gateway.store.routing import Loads, RouteKey, RouteView


def decode_loads(flat: list[str]) -> Loads:
    return {flat[i]: (int(flat[i + 1]), int(flat[i + 2])) for i in range(0, len(flat), 3)}


class RedisRouting:
    def __init__(self, connection: RedisConnection, clock: Callable[[], float] = time.time) -> None:
        self._c = connection
        self._names = connection.names
        self._settings = connection.settings
        self._clock = clock

    def _prefix_args(self) -> list[Any]:
        """RECORD_PREFIX's and STARTED's: now_us, ttl_us, ttl_ms, max entries, per-hash key prefix."""
        s = self._settings
        return [to_us(self._clock()), to_us(s.prefix_index_ttl_s), ms(s.prefix_index_ttl_s),
                s.prefix_index_max_entries, self._names.prefix_hash()]

    @redis_errors
    async def lookup(self, key: RouteKey) -> RouteView:
        hashes, session_id = key.block_hashes, key.session_id
        n = self._names
        session_key = n.session(key.tenant_id, session_id or "")
        fresh = f"({to_us(self._clock()) - to_us(self._settings.prefix_index_ttl_s)}"
        loads, previous, matched = await self._c.script("LOOKUP")(
            keys=[n.inflight_replicas(), session_key, *(n.prefix_hash(h) for h in hashes)],
            args=[n.inflight(), fresh, "" if session_id is None else "1"],
        )
        return RouteView(
            decode_loads(loads),
            {matched[i]: int(matched[i + 1]) for i in range(0, len(matched), 2)},
            previous or None,
        )

    @redis_errors
    async def started(self, backend_id: str, key: RouteKey, moved: Inflight | None = None) -> None:
        check_text("backend id", backend_id)
        hashes = [str(h) for h in dict.fromkeys(key.block_hashes)]
        session_id = key.session_id
        n, c = self._names, self._c
        session_key = n.session(key.tenant_id, session_id or "")
        if moved is not None:
            c.hold_lease()
        prefix_keys = [n.prefix_lru(), *(n.prefix_hash(h) for h in hashes)] if hashes else []
        await c.script("STARTED")(
            keys=[session_key, *c.inflight_keys(), *prefix_keys],
            args=[
                backend_id, "" if session_id is None else ms(self._settings.session_ttl_s),
                "" if moved is None else moved.backend_id, 0 if moved is None else moved.prefill_tokens,
                0 if moved is None else moved.decode_tokens, c.lease_ms, c.replica, *self._prefix_args(), *hashes,
            ],
        )

    @redis_errors
    async def record_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        check_text("backend id", backend_id)
        hashes = [str(h) for h in dict.fromkeys(check_hashes(block_hashes))]
        if not hashes:
            return
        n = self._names
        await self._c.script("RECORD_PREFIX")(
            keys=[n.prefix_lru(), *(n.prefix_hash(h) for h in hashes)],
            args=[backend_id, *self._prefix_args(), *hashes],
        )

    @redis_errors
    async def remove_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        hashes = [str(h) for h in dict.fromkeys(check_hashes(block_hashes))]
        if hashes:
            keys = [self._names.prefix_lru(), *(self._names.prefix_hash(h) for h in hashes)]
            await self._c.script("REMOVE_PREFIX")(keys=keys, args=[backend_id, *hashes])

    async def add_inflight(self, inflight: Inflight) -> None:
        await self._change(inflight, 1)

    async def release_inflight(self, inflight: Inflight) -> None:
        await self._change(inflight, -1)

    @redis_errors
    async def _change(self, inflight: Inflight, sign: int) -> None:
        c = self._c
        c.hold_lease()
        await c.script("CHANGE_INFLIGHT")(
            keys=c.inflight_keys(),
            args=[inflight.backend_id, sign * inflight.prefill_tokens, sign * inflight.decode_tokens, c.lease_ms,
                  c.replica],
        )

    @redis_errors
    async def correct_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        check_tokens(backend_id, prefill_tokens, decode_tokens)
        c = self._c
        c.hold_lease()
        await c.script("CORRECT_INFLIGHT")(
            keys=c.inflight_keys(),
            args=[backend_id, prefill_tokens, decode_tokens, c.lease_ms, c.replica, self._names.inflight()],
        )

    @redis_errors
    async def loads(self) -> Loads:
        n = self._names
        return decode_loads(await self._c.script("LOADS")(keys=[n.inflight_replicas()], args=[n.inflight()]))
