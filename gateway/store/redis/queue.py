"""`RedisQueue`: the batch queue (gateway/store/queue.py) in Redis, shared by every replica.

    {p}batch:{id}           hash    tenant, account, key, model, items, answered, started (PEXPIRE keep once answered)
    {p}batch_items:{id}     hash    index -> the item's request (each dropped once answered)
    {p}batch_results:{id}   hash    index -> the item's answer (PEXPIRE keep once the batch is answered)
    {p}batch_ready:{tenant} zset    "{id}:{index:06d}" -> ms (Redis clock) it may be claimed from: its enqueue
                                    time, or its lease's end while claimed (a dead worker's item comes back)
    {p}batch_turns          zset    tenant -> its turn: the tenants with unanswered items, claimed round-robin
                                    (one looked at, served or not, goes to the back)
    {p}batch_running        zset    "{id}:{index:06d}" -> its lease's end, while claimed (the running count)
    {p}batch_depth          hash    open: every tenant's unanswered items
    {p}batch_leases         hash    "{id}:{index:06d}" -> "{token}:{claims}:{releases}" of its latest claim
                                    (the token emptied when the claim gives the item back)
    {p}batch_open:{tenant}  hash    items, bytes: the tenant's items not answered yet, their requests' bytes
    {p}batch_work           channel a message on each enqueue, and each item given back to be claimed at once

Each change is one Lua script (atomic across replicas), on Redis's clock (`TIME`), so replicas with
skewed clocks agree on when a lease ends. Items of one batch share a score and order by index. A
claim looks at the next `TURNS_LOOKED_AT` tenants in turn and takes the first ready item among them
(their `batch_ready:{tenant}` keys are built inside the script from the prefix: one Redis, or a
Cluster with a {hash tag} in `key_prefix`, as the other scripts need). The
queue has its own few connections (`QUEUE_CONNECTIONS`): batch work never takes one of the
requests' bounded pool (`redis_max_connections`) nor waits for one. One of them, once a worker
waits for work (`wait_for_work`), stays subscribed to `batch_work`: an enqueue on any replica wakes
every replica's waiting worker at once, with no command sent while the queue is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.store.checks import check_id
from gateway.store.errors import InvalidArgument
from gateway.store.queue import TURNS_LOOKED_AT, BatchState, ClaimedItem, NewBatch, check_bounds, check_lease
from gateway.store.redis.connection import ms, redis_errors
from gateway.store.redis.pool import WaitingConnectionPool
from gateway.store.settings import StoreSettings

QUEUE_CONNECTIONS = 5  # one of them subscribed to the wake-ups while a worker waits

_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# KEYS: open counts, batch, items, ready (the tenant's), turns, depth. ARGV: max_queued, max_bytes, tenant, account,
# key, model, batch id, payloads... -> 1 queued, 0 over a bound, -1 the batch id exists
ENQUEUE = _NOW + """
local n = #ARGV - 7
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local size = 0
for i = 1, n do size = size + #ARGV[7 + i] end
local open = redis.call('HMGET', KEYS[1], 'items', 'bytes')
if tonumber(open[1] or '0') + n > tonumber(ARGV[1]) or tonumber(open[2] or '0') + size > tonumber(ARGV[2]) then
  return 0
end
redis.call('HINCRBY', KEYS[1], 'items', n)
redis.call('HINCRBY', KEYS[1], 'bytes', size)
redis.call('HINCRBY', KEYS[6], 'open', n)
redis.call('HSET', KEYS[2], 'tenant', ARGV[3], 'account', ARGV[4], 'key', ARGV[5], 'model', ARGV[6],
           'items', n, 'answered', 0, 'started', 0)
for i = 1, n do
  local index = string.format('%06d', i - 1)
  redis.call('HSET', KEYS[3], index, ARGV[7 + i])
  redis.call('ZADD', KEYS[4], now, ARGV[7] .. ':' .. index)
end
if not redis.call('ZSCORE', KEYS[5], ARGV[3]) then
  local last = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
  redis.call('ZADD', KEYS[5], #last > 0 and tonumber(last[2]) + 1 or 1, ARGV[3])
end
redis.call('PUBLISH', KEYS[7], ARGV[7])
return 1
"""

# KEYS: turns, leases, running. ARGV: lease ms, token, key prefix, tenants to look at.
# -> {tenant, member, claims, releases} or nil (none of those tenants has a ready item: the next claim looks further)
CLAIM = _NOW + """
local tenants = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1)
for _, tenant in ipairs(tenants) do
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('ZADD', KEYS[1], tonumber(last[2]) + 1, tenant)
  local ready = ARGV[3] .. 'batch_ready:' .. tenant
  local found = redis.call('ZRANGEBYSCORE', ready, '-inf', now, 'LIMIT', 0, 1)
  if #found == 0 and redis.call('EXISTS', ready) == 0 then redis.call('ZREM', KEYS[1], tenant) end
  if #found > 0 then
    local member = found[1]
    local held = redis.call('HGET', KEYS[2], member)
    local claims, releases = 1, 0
    if held then
      local c, r = string.match(held, ':(%d+):(%d+)$')
      claims, releases = tonumber(c) + 1, tonumber(r)
    end
    redis.call('HSET', KEYS[2], member, ARGV[2] .. ':' .. claims .. ':' .. releases)
    redis.call('ZADD', ready, now + tonumber(ARGV[1]), member)
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[1]), member)
    return {tenant, member, claims, releases}
  end
end
return nil
"""

# KEYS: ready (the tenant's), leases, running. ARGV: member, token, ms from now, 0 renew or 1 release (the claim
# ends). -> 1 moved, 0 not ours
MOVE = _NOW + """
local held = redis.call('HGET', KEYS[2], ARGV[1])
if not held or not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local token, claims, releases = string.match(held, '^(.*):(%d+):(%d+)$')
if token ~= ARGV[2] then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
if ARGV[4] ~= '0' then
  redis.call('HSET', KEYS[2], ARGV[1], ':' .. claims .. ':' .. (tonumber(releases) + 1))
  redis.call('ZREM', KEYS[3], ARGV[1])
else
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[1])
end
return 1
"""

# KEYS: ready (the tenant's), leases, batch, items, results, open counts, turns, running, depth.
# ARGV: member, index, answer, keep ms, tenant. -> 1 stored, 0 had one
COMPLETE = """
if redis.call('HEXISTS', KEYS[5], ARGV[2]) == 1 or redis.call('EXISTS', KEYS[3]) == 0 then return 0 end
redis.call('HSET', KEYS[5], ARGV[2], ARGV[3])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[8], ARGV[1])
if redis.call('HINCRBY', KEYS[9], 'open', -1) < 0 then redis.call('HSET', KEYS[9], 'open', 0) end
if redis.call('ZCARD', KEYS[1]) == 0 then redis.call('ZREM', KEYS[7], ARGV[5]) end
local size = redis.call('HSTRLEN', KEYS[4], ARGV[2])
redis.call('HDEL', KEYS[4], ARGV[2])
if redis.call('HINCRBY', KEYS[6], 'items', -1) <= 0 then redis.call('DEL', KEYS[6])
elseif redis.call('HINCRBY', KEYS[6], 'bytes', -size) < 0 then redis.call('HSET', KEYS[6], 'bytes', 0) end
local answered = redis.call('HINCRBY', KEYS[3], 'answered', 1)
if answered >= tonumber(redis.call('HGET', KEYS[3], 'items')) then
  redis.call('PEXPIRE', KEYS[3], ARGV[4])
  redis.call('PEXPIRE', KEYS[5], ARGV[4])
  redis.call('DEL', KEYS[4])
end
return 1
"""

# KEYS: depth, running. -> {open items, running items}
DEPTH = _NOW + """
return {tonumber(redis.call('HGET', KEYS[1], 'open') or '0'), redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf')}
"""


class RedisQueue:
    def __init__(self, settings: StoreSettings) -> None:
        """Connect lazily to `settings.redis_url` (its own connections, see the module's doc)."""
        assert settings.redis_url is not None
        self._pool = WaitingConnectionPool.from_url(
            settings.redis_url, decode_responses=True, max_connections=QUEUE_CONNECTIONS,
            wait_s=settings.redis_timeout_s,
            socket_timeout=settings.redis_timeout_s, socket_connect_timeout=settings.redis_timeout_s,
        )
        self._redis: Any = aioredis.Redis(connection_pool=self._pool)
        self._p = settings.key_prefix
        self._scripts: dict[str, Any] = {}
        self._wakeups: Any = None  # the subscription to `batch_work`, made by the first wait

    def _script(self, name: str, source: str) -> Any:
        found = self._scripts.get(name)
        if found is None:
            found = self._scripts[name] = self._redis.register_script(source)
        return found

    async def aclose(self) -> None:
        if self._wakeups is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._wakeups.aclose()
        await self._redis.aclose()
        await self._pool.disconnect()

    def _batch(self, batch_id: str) -> str:
        return f"{self._p}batch:{batch_id}"

    def _items(self, batch_id: str) -> str:
        return f"{self._p}batch_items:{batch_id}"

    def _results(self, batch_id: str) -> str:
        return f"{self._p}batch_results:{batch_id}"

    def _ready(self, tenant_id: str) -> str:
        return f"{self._p}batch_ready:{tenant_id}"

    def _turns_leases_running(self) -> list[str]:
        return [f"{self._p}batch_turns", f"{self._p}batch_leases", f"{self._p}batch_running"]

    def _depth(self) -> str:
        return f"{self._p}batch_depth"

    def _open(self, tenant_id: str) -> str:
        return f"{self._p}batch_open:{tenant_id}"

    def _work(self) -> str:
        return f"{self._p}batch_work"

    @staticmethod
    def _member(item: ClaimedItem) -> str:
        return f"{item.batch_id}:{item.index:06d}"

    @redis_errors
    async def enqueue(self, batch: NewBatch, max_queued: int, max_bytes: int) -> bool:
        check_bounds(max_queued, max_bytes)
        b = batch.batch_id
        keys = [self._open(batch.tenant_id), self._batch(b), self._items(b), self._ready(batch.tenant_id),
                self._turns_leases_running()[0], self._depth(), self._work()]
        args = [max_queued, max_bytes, batch.tenant_id, batch.account_id, batch.key_id, batch.model, b,
                *batch.items]
        outcome = int(await self._script("enqueue", ENQUEUE)(keys=keys, args=args))
        if outcome < 0:
            raise InvalidArgument(f"batch {b!r} is queued already")
        return outcome == 1

    @redis_errors
    async def claim(self, lease_s: float) -> ClaimedItem | None:
        token = secrets.token_hex(8)
        while True:
            args = [ms(check_lease(lease_s)), token, self._p, TURNS_LOOKED_AT]
            found = await self._script("claim", CLAIM)(keys=self._turns_leases_running(), args=args)
            if found is None:
                return None
            tenant_id, member, attempts, released = str(found[0]), str(found[1]), int(found[2]), int(found[3])
            batch_id, index = member.rsplit(":", 1)
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hgetall(self._batch(batch_id))
                pipe.hget(self._items(batch_id), index)
                meta, payload = await pipe.execute()
            if not meta or payload is None:  # gone (answered meanwhile, or its batch expired): not work
                _, leases, running = self._turns_leases_running()
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.zrem(self._ready(tenant_id), member)
                    pipe.hdel(leases, member)
                    pipe.zrem(running, member)
                    await pipe.execute()
                continue
            if meta.get("started") != "1":
                await self._redis.hset(self._batch(batch_id), "started", 1)
            return ClaimedItem(batch_id, int(index), meta["tenant"], meta["account"], meta["key"], meta["model"],
                               payload, token, attempts, released)

    async def _move(self, item: ClaimedItem, in_s: float, attempt_change: int) -> bool:
        args = [self._member(item), item.token, ms(max(0.0, in_s)), attempt_change]
        _, leases, running = self._turns_leases_running()
        keys = [self._ready(item.tenant_id), leases, running]
        return int(await self._script("move", MOVE)(keys=keys, args=args)) == 1

    @redis_errors
    async def renew(self, item: ClaimedItem, lease_s: float) -> bool:
        return await self._move(item, check_lease(lease_s), 0)

    @redis_errors
    async def release(self, item: ClaimedItem, retry_in_s: float) -> None:
        if await self._move(item, retry_in_s, 1) and retry_in_s <= 0:
            await self._redis.publish(self._work(), item.batch_id)

    async def wait_for_work(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        try:
            if self._wakeups is None:
                self._wakeups = self._redis.pubsub(ignore_subscribe_messages=True)
                await self._wakeups.subscribe(self._work())
            while (left := deadline - time.monotonic()) > 0:
                if await self._wakeups.get_message(timeout=left) is not None:
                    while await self._wakeups.get_message(timeout=0) is not None:
                        pass  # the wake-ups that arrived together: one look at the queue takes them all
                    return
        except (RedisError, OSError):  # Redis is down: wait the timeout out, subscribe again next time
            wakeups, self._wakeups = self._wakeups, None
            if wakeups is not None:
                with contextlib.suppress(RedisError, OSError):
                    await wakeups.aclose()
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))

    @redis_errors
    async def complete(self, item: ClaimedItem, result: str, keep_s: float) -> bool:
        b = item.batch_id
        turns, leases, running = self._turns_leases_running()
        keys = [self._ready(item.tenant_id), leases, self._batch(b), self._items(b), self._results(b),
                self._open(item.tenant_id), turns, running, self._depth()]
        args = [self._member(item), f"{item.index:06d}", result, ms(check_lease(keep_s)), item.tenant_id]
        return int(await self._script("complete", COMPLETE)(keys=keys, args=args)) == 1

    @redis_errors
    async def state(self, tenant_id: str, batch_id: str) -> BatchState | None:
        check_id("tenant id", tenant_id)
        check_id("batch id", batch_id)
        meta = await self._redis.hgetall(self._batch(batch_id))
        if not meta or meta.get("tenant") != tenant_id:
            return None
        if int(meta["answered"]) < int(meta["items"]):
            return BatchState(batch_id, meta["model"], "running" if meta.get("started") == "1" else "queued", ())
        answers = await self._redis.hgetall(self._results(batch_id))
        return BatchState(batch_id, meta["model"], "done", tuple(answers[k] for k in sorted(answers)))

    @redis_errors
    async def queued_items(self, tenant_id: str) -> tuple[int, int]:
        items, size = await self._redis.hmget(self._open(check_id("tenant id", tenant_id)), "items", "bytes")
        return int(items or 0), int(size or 0)

    @redis_errors
    async def depth(self) -> tuple[int, int]:
        open_items, running = await self._script("depth", DEPTH)(keys=[self._depth(), self._turns_leases_running()[2]])
        return max(0, int(open_items) - int(running)), int(running)

    async def expire(self) -> int:
        return 0  # the keys' own TTLs
