"""`RedisCache`: the response cache in Redis, shared by every replica.

Each entry is a string `{p}cache:{tenant}:{key}` written with `SET ... PX ttl`, so Redis expires it
on its own. The total is bounded by the store rather than by Redis's eviction policy (the store's
other keys, the ledger above all, must never be evicted: run Redis with `maxmemory-policy
noeviction`): the index `{p}cache_index` (entry -> expiry, ms on Redis's clock), `{p}cache_sizes`
(entry -> bytes counted) and `{p}cache_bytes` (their sum) are kept by `PUT`, one script, which
forgets entries already expired and then drops those nearest their expiry until the new one fits
`cache_max_bytes`. So the cache's share of Redis's memory is `cache_max_bytes` plus the
bookkeeping that `ENTRY_OVERHEAD_BYTES` per entry accounts for; size `maxmemory` above it.
"""

from __future__ import annotations

from typing import Any

from gateway.store.cache import check_entry, entry_bytes
from gateway.store.redis.connection import RedisConnection, ms, redis_errors
from gateway.store.redis.scripts import _INT, _NOW_MS

# KEYS: entry, index, sizes, total. ARGV: value, ttl ms, size, max bytes, member, entry key prefix.
# Returns 1 (kept) or 0 (it cannot fit even in an empty cache).
PUT = _INT + _NOW_MS + """
local index, sizes, total = KEYS[2], KEYS[3], KEYS[4]
local function drop(member)
  local size = tonumber(redis.call('HGET', sizes, member) or '0')
  redis.call('HDEL', sizes, member)
  redis.call('ZREM', index, member)
  redis.call('DEL', ARGV[6] .. member)
  redis.call('DECRBY', total, int(size))
end
local now = now_ms()
for _, member in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, 64)) do drop(member) end
if redis.call('ZSCORE', index, ARGV[5]) then drop(ARGV[5]) end
local size, max = tonumber(ARGV[3]), tonumber(ARGV[4])
while num(total) + size > max do
  local nearest = redis.call('ZPOPMIN', index)
  if #nearest == 0 then return 0 end
  drop(nearest[1])
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', index, now + tonumber(ARGV[2]), ARGV[5])
redis.call('HSET', sizes, ARGV[5], ARGV[3])
redis.call('INCRBY', total, ARGV[3])
return 1
"""


class RedisCache:
    def __init__(self, connection: RedisConnection) -> None:
        self._c = connection
        self._max_entry_bytes = connection.settings.cache_max_entry_bytes
        self._max_bytes = connection.settings.cache_max_bytes
        self._put: Any = None  # registered on first use

    def _entry(self, tenant_id: str, key: str) -> str:
        return f"{self._c.names.cache()}{tenant_id}:{key}"

    @redis_errors
    async def get(self, tenant_id: str, key: str) -> str | None:
        check_entry(tenant_id, key)
        found: str | None = await self._c.redis.get(self._entry(tenant_id, key))
        return found

    @redis_errors
    async def put(self, tenant_id: str, key: str, value: str, ttl_s: float) -> bool:
        check_entry(tenant_id, key, ttl_s)
        size = entry_bytes(key, value)
        if size > min(self._max_entry_bytes, self._max_bytes):
            return False
        if self._put is None:
            self._put = self._c.redis.register_script(PUT)
        n = self._c.names
        kept = await self._put(
            keys=[self._entry(tenant_id, key), n.cache("index"), n.cache("sizes"), n.cache("bytes")],
            args=[value, ms(ttl_s), size, self._max_bytes, f"{tenant_id}:{key}", n.cache()],
        )
        return bool(kept)
