"""`RedisAdapters`: finetunes in Redis. Layout (under the store's key prefix):

    {p}finetune:{id}              string  the finetune's JSON
    {p}finetunes:{account}        zset    finetune id -> created_at (the account's list, oldest first)
    {p}finetune_names:{account}   hash    name -> finetune id

Create, add-asset and delete are one Lua script each, so the per-account cap and unique names hold
across replicas; every command is one the shipped ACL allows (tests/gateway/store/redis/test_acl.py).
"""

from __future__ import annotations

from typing import Any

from gateway.store.adapters import Finetune
from gateway.store.checks import check_id
from gateway.store.errors import Conflict, NotFound
from gateway.store.redis.connection import RedisConnection, redis_errors

# KEYS: finetune, list, names; ARGV: id, name, json, created_at, max
_CREATE = """
if redis.call('HGET', KEYS[3], ARGV[2]) then return 'name' end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return 'full' end
redis.call('SET', KEYS[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[1])
return 'ok'
"""
# KEYS: finetune, list, names; ARGV: id -> the deleted JSON, or false
_DELETE = """
if redis.call('ZSCORE', KEYS[2], ARGV[1]) == false then return false end
local data = redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if data then redis.call('HDEL', KEYS[3], cjson.decode(data)['name']) end
return data
"""
# KEYS: finetune, list; ARGV: id, file name -> the updated JSON, or false
_ADD_ASSET = """
if redis.call('ZSCORE', KEYS[2], ARGV[1]) == false then return false end
local data = cjson.decode(redis.call('GET', KEYS[1]))
local seen = false
for _, name in ipairs(data['assets']) do if name == ARGV[2] then seen = true end end
if not seen then table.insert(data['assets'], ARGV[2]) table.sort(data['assets']) end
local text = cjson.encode(data)
redis.call('SET', KEYS[1], text)
return text
"""


class RedisAdapters:
    def __init__(self, connection: RedisConnection) -> None:
        self._redis: Any = connection.redis
        self._p = connection.names.p
        self._create = self._redis.register_script(_CREATE)
        self._delete = self._redis.register_script(_DELETE)
        self._add_asset = self._redis.register_script(_ADD_ASSET)

    def _keys(self, account_id: str, finetune_id: str) -> list[str]:
        check_id("account id", account_id)
        check_id("finetune id", finetune_id)
        return [f"{self._p}finetune:{finetune_id}", f"{self._p}finetunes:{account_id}",
                f"{self._p}finetune_names:{account_id}"]

    @redis_errors
    async def create_finetune(self, finetune: Finetune, max_per_account: int) -> None:
        keys = self._keys(finetune.account_id, finetune.id)
        verdict = await self._create(keys=keys, args=[finetune.id, finetune.name, finetune.to_json(),
                                                      finetune.created_at, max_per_account])
        if verdict == "name":
            raise Conflict(f"account {finetune.account_id} already has a finetune named {finetune.name!r}")
        if verdict == "full":
            raise Conflict(f"account {finetune.account_id} already has {max_per_account} finetunes, the most it may "
                           "hold: delete one first")

    @redis_errors
    async def get_finetune(self, account_id: str, name_or_id: str) -> Finetune | None:
        list_key = f"{self._p}finetunes:{check_id('account id', account_id)}"
        finetune_id = name_or_id
        if ":" in name_or_id or await self._redis.zscore(list_key, name_or_id) is None:
            finetune_id = await self._redis.hget(f"{self._p}finetune_names:{account_id}", name_or_id)
            if finetune_id is None:
                return None
        data = await self._redis.get(f"{self._p}finetune:{finetune_id}")
        return None if data is None else Finetune.from_json(data)

    @redis_errors
    async def list_finetunes(self, account_id: str) -> list[Finetune]:
        # ZRANGEBYSCORE, not ZRANGE: the shipped ACL (infra/compose.yaml) allows the former only
        ids = await self._redis.zrangebyscore(f"{self._p}finetunes:{check_id('account id', account_id)}", "-inf", "+inf")
        if not ids:
            return []
        found = await self._redis.mget([f"{self._p}finetune:{i}" for i in ids])
        return [Finetune.from_json(data) for data in found if data is not None]

    @redis_errors
    async def add_asset(self, account_id: str, finetune_id: str, file_name: str) -> Finetune:
        data = await self._add_asset(keys=self._keys(account_id, finetune_id)[:2], args=[finetune_id, file_name])
        if not data:
            raise NotFound(f"no finetune {finetune_id} in account {account_id}")
        return Finetune.from_json(data)

    @redis_errors
    async def delete_finetune(self, account_id: str, finetune_id: str) -> bool:
        return bool(await self._delete(keys=self._keys(account_id, finetune_id), args=[finetune_id]))
