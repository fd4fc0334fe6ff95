"""The response cache: answers kept for a while, per tenant, so an identical request is served again
without a backend (the gateway's opt-in exact cache, gateway/pipeline/answer_cache.py).

An entry is a text value under (tenant id, key), living `ttl_s` from its write (a later write of the
same key replaces it and its TTL). The key is an opaque string the caller derives (a hash of what
makes two requests identical); the tenant id is part of every entry's name, so no lookup of one
tenant can find another's entry, whatever key it asks for.

Bounded in every backend: an entry over `cache_max_entry_bytes` (its value's UTF-8 bytes plus
`ENTRY_OVERHEAD_BYTES` for its bookkeeping) is refused (`put` answers False), and all entries
together stay within `cache_max_bytes`, counted the same way: the local store drops the least
recently used first, Redis the one closest to its expiry (redis/cache.py). `cache_max_bytes = 0`
keeps nothing. The cache is volatile, as AI Gateway's is: an entry may go before its TTL (evicted,
a restart of the local store, another process of the local store's shared mode that never saw it).

Implementations: `local.cache.MemoryCache` (this process's memory) and `redis.cache.RedisCache`.
"""

from __future__ import annotations

from typing import Protocol

from gateway.store.checks import check_id, check_text
from gateway.store.errors import InvalidArgument

ENTRY_OVERHEAD_BYTES = 200  # what an entry's name, index and size records cost beside its value (counted in caps)
MAX_KEY_CHARS = 128


class Cache(Protocol):
    async def get(self, tenant_id: str, key: str) -> str | None:
        """The tenant's live entry under `key`, or None (never written, expired or evicted)."""
        ...

    async def put(self, tenant_id: str, key: str, value: str, ttl_s: float) -> bool:
        """Keep `value` under the tenant's `key` for `ttl_s` seconds (> 0), replacing what was there;
        False (and nothing kept) when the entry is over the size cap per entry."""
        ...


def entry_bytes(key: str, value: str) -> int:
    """What an entry counts against the caps."""
    return len(value.encode()) + len(key) + ENTRY_OVERHEAD_BYTES


def check_entry(tenant_id: str, key: str, ttl_s: float | None = None) -> None:
    """The arguments both backends refuse alike."""
    check_id("tenant id", tenant_id)
    check_text("cache key", key, MAX_KEY_CHARS)
    if ":" in key or " " in key:
        raise InvalidArgument("cache key must not contain ':' or spaces (it becomes part of a store key)")
    if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float)) or not 0 < ttl_s < 1e9):
        raise InvalidArgument(f"ttl_s must be a positive number of seconds, got {ttl_s!r}")
