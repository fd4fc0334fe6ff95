"""The Redis store: shared state for several gateway replicas (`EDGERUN_REDIS_URL`).

Every check-and-change is one Lua script (`redis_scripts`), so replicas never race: limits,
budgets, in-flight counters, prefix records and ledger appends. Nothing is cached locally: a
key lookup is one HGETALL, so a revocation holds on every replica at once.

In-flight counts are kept per replica, in hashes `{p}inflight:{replica}:prefill|decode` that
expire `inflight_lease_s` after the replica's last touch. A background task owned by the store
(started on first use, cancelled by `aclose`) renews the lease every third of it, so a live
replica's long requests stay counted while a crashed replica's counts vanish within the lease.
`loads()` sums the live replicas; `aclose()` deletes this replica's counts at once. The same
lease keeps the per-tenant request slots (`{p}slots:{tenant}`, request id -> lease end on
Redis's clock) of this replica's requests alive.

Each process holds at most `redis_max_connections` connections; a command past them waits for one, up
to `redis_timeout_s`. Redis connection failures and timeouts become `StoreUnavailable`.

A budget reservation whose call fails that way may still be applied by Redis later (it was only slow),
and its caller, answered 503, settles nothing. Each `reserve_budget` call carries a token that its script
marks when it applies; a failed call's token goes to a background task owned by the store (`redis_undo`,
drained or stopped by `aclose`) that takes the reservation back, or marks the token so that it applies
nothing when it lands. A call that succeeds pays one SET inside its script, no extra round trip.
"""

from __future__ import annotations

import asyncio
import functools
import os
import re
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from secrets import token_hex
from typing import Any, ParamSpec, TypeVar

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.store import apikeys, redis_scripts
from gateway.store.base import Store
from gateway.store.checks import (
    check_count,
    check_hashes,
    check_id,
    check_models,
    check_month,
    check_reservation,
    check_settlement,
    check_text,
    check_tokens,
)
from gateway.store.errors import Conflict, InvalidArgument, NotFound, StoreFull, StoreUnavailable
from gateway.store.lease import LeaseTask
from gateway.store.limits import ALLOWED, WINDOW_MS, check_limit_args, refused, to_ms
from gateway.store.models import ApiKey, BudgetDecision, LimitDecision, Tenant, UsageRecord, new_tenant, to_us
from gateway.store.redis_codec import KeyNames, decode_key, decode_tenant, encode_key, encode_tenant
from gateway.store.redis_ledger import RedisLedger
from gateway.store.redis_pool import PoolExhausted, WaitingConnectionPool
from gateway.store.redis_undo import ReservationUndo
from gateway.store.settings import StoreSettings

P = ParamSpec("P")
R = TypeVar("R")
_BUDGET_TTL_S = 45 * 24 * 3600  # a month's counter outlives the month
_TOKEN_TTL_S = 120  # a reservation's token outlives its undo's tries (half of it) and a late arrival after them
_UNDO_CLOSE_WAIT_S = 5.0  # aclose gives queued undos this long
_SET_IF_ABSENT_THEN_GET = "redis.call('SET', KEYS[1], ARGV[1], 'NX') return redis.call('GET', KEYS[1])"


def _store_error(exc: RedisError) -> StoreUnavailable | None:
    """The store's error for a Redis failure that is not a bug (None: let it show as one)."""
    if isinstance(exc, OutOfMemoryError):
        return StoreFull(f"Redis is full (maxmemory reached: {exc}); free memory or raise maxmemory")
    if isinstance(exc, PoolExhausted):
        return StoreUnavailable(f"Redis answers too slowly for this load ({exc}); check the server's latency, "
                                "or raise EDGERUN_REDIS_MAX_CONNECTIONS")
    if isinstance(exc, RedisConnectionError | RedisTimeoutError):
        return StoreUnavailable(f"Redis is unreachable ({exc}); check EDGERUN_REDIS_URL and the server")
    return None


def _redis_errors(fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except RedisError as exc:
            converted = _store_error(exc)
            if converted is None:
                raise
            raise converted from exc

    return wrapper


def default_replica_id() -> str:
    host = re.sub(r"[^A-Za-z0-9_.\-]", "-", socket.gethostname())[:80] or "gateway"
    return f"{host}-{os.getpid()}-{token_hex(3)}"


class RedisStore(Store):
    def __init__(self, settings: StoreSettings, clock: Callable[[], float] = time.time) -> None:
        """Connect lazily to `settings.redis_url`; keys are namespaced by `settings.key_prefix`."""
        if not settings.redis_url:
            raise InvalidArgument("RedisStore needs a Redis URL: set EDGERUN_REDIS_URL (or settings.redis_url)")
        self._clock = clock
        self._settings = settings
        self._names = KeyNames(settings.key_prefix)
        self._replica = check_id("replica id", settings.replica_id or default_replica_id())
        # bounded; a command finding every connection busy waits for one (redis_pool.py)
        self._pool = WaitingConnectionPool.from_url(
            settings.redis_url, decode_responses=True, max_connections=settings.redis_max_connections,
            wait_s=settings.redis_timeout_s,
            socket_timeout=settings.redis_timeout_s, socket_connect_timeout=settings.redis_timeout_s,
        )
        # decode_responses: every reply is str, which redis-py's annotations cannot express, hence Any.
        self._redis: Any = aioredis.Redis(connection_pool=self._pool)
        self._scripts = {
            name: self._redis.register_script(getattr(redis_scripts, name))
            for name in ("CHECK_AND_CONSUME", "RECONCILE_TOKENS", "RESERVE_BUDGET", "SETTLE_BUDGET",
                         "UNDO_RESERVATIONS",
                         "RECORD_PREFIX", "REMOVE_PREFIX", "MATCH_PREFIX", "CHANGE_INFLIGHT",
                         "CORRECT_INFLIGHT", "PRUNE_REPLICA", "CREATE_TENANT",
                         "ACQUIRE_SLOT", "RENEW_SLOTS")
        }
        self._ledger = RedisLedger(self._redis, self._names, settings, self._replica)
        self._lease = LeaseTask("edgerun-inflight-lease", self._renew_lease)
        self._undo = ReservationUndo(
            lambda keys: self._scripts["UNDO_RESERVATIONS"](keys=keys, args=[_TOKEN_TTL_S]),
            give_up_after_s=_TOKEN_TTL_S / 2,
        )
        self._slots: dict[str, set[str]] = {}  # tenant -> request ids this replica holds (their lease is renewed)
        self._closed = False

    # --- tenants ---

    @_redis_errors
    async def create_tenant(
        self,
        name: str,
        account_ids: Sequence[str],
        *,
        allowed_models: Iterable[str] | None = None,
        monthly_budget_micro: int | None = None,
        tenant_id: str | None = None,
        max_concurrent_requests: int | None = None,
    ) -> Tenant:
        tenant = new_tenant(
            name, account_ids, allowed_models, monthly_budget_micro, tenant_id, now=self._clock(),
            max_concurrent_requests=max_concurrent_requests,
        )
        n = self._names
        fields = [x for pair in encode_tenant(tenant).items() for x in pair]
        status = await self._scripts["CREATE_TENANT"](
            keys=[n.tenant(tenant.id), n.tenants(), *(n.account(a) for a in tenant.account_ids)],
            args=[tenant.id, *fields],
        )
        if status == -1:
            raise Conflict(f"tenant {tenant.id!r} already exists")
        if status > 0:
            raise Conflict(f"account {tenant.account_ids[status - 1]!r} is already owned by another tenant")
        return tenant

    @_redis_errors
    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        fields = await self._redis.hgetall(self._names.tenant(tenant_id))
        return decode_tenant(tenant_id, fields) if fields else None

    @_redis_errors
    async def get_tenant_by_account(self, account_id: str) -> Tenant | None:
        tenant_id = await self._redis.get(self._names.account(account_id))
        return None if tenant_id is None else await self.get_tenant(tenant_id)

    @_redis_errors
    async def list_tenants(self) -> list[Tenant]:
        ids = sorted(await self._redis.smembers(self._names.tenants()))
        async with self._redis.pipeline(transaction=False) as pipe:
            for tenant_id in ids:
                pipe.hgetall(self._names.tenant(tenant_id))
            rows = await pipe.execute()
        tenants = [decode_tenant(i, f) for i, f in zip(ids, rows) if f]
        return sorted(tenants, key=lambda t: (t.created_at, t.id))

    # --- API keys ---

    @_redis_errors
    async def create_key(
        self,
        tenant_id: str,
        *,
        allowed_models: Iterable[str] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
    ) -> tuple[ApiKey, str]:
        if not await self._redis.exists(self._names.tenant(tenant_id)):
            raise NotFound(f"tenant {tenant_id!r} does not exist")
        secret = apikeys.new_secret()
        key = ApiKey(
            id=apikeys.new_id("key"), tenant_id=tenant_id, prefix=apikeys.shown_prefix(secret),
            allowed_models=check_models(allowed_models), rpm=rpm, tpm=tpm, created_at=self._clock(),
        )
        key_hash = apikeys.hash_secret(secret)
        assert key_hash is not None
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(self._names.apikey(key_hash), mapping=encode_key(key, key_hash))
            pipe.set(self._names.apikey_id(key.id), key_hash)
            pipe.sadd(self._names.tenant_keys(tenant_id), key.id)
            await pipe.execute()
        return key, secret

    @_redis_errors
    async def lookup_key(self, secret: str) -> ApiKey | None:
        presented = apikeys.hash_secret(secret)
        if presented is None:
            return None
        fields = await self._redis.hgetall(self._names.apikey(presented))
        if not fields or not apikeys.same_hash(fields["hash"], presented):
            return None
        key = decode_key(fields)
        return None if key.is_revoked else key

    @_redis_errors
    async def get_key(self, key_id: str) -> ApiKey | None:
        key_hash = await self._redis.get(self._names.apikey_id(key_id))
        fields = {} if key_hash is None else await self._redis.hgetall(self._names.apikey(key_hash))
        return decode_key(fields) if fields else None

    @_redis_errors
    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        key_ids = sorted(await self._redis.smembers(self._names.tenant_keys(tenant_id)))
        hashes = await self._redis.mget([self._names.apikey_id(k) for k in key_ids]) if key_ids else []
        async with self._redis.pipeline(transaction=False) as pipe:
            for key_hash in hashes:
                if key_hash is not None:
                    pipe.hgetall(self._names.apikey(key_hash))
            rows = await pipe.execute()
        return sorted((decode_key(f) for f in rows if f), key=lambda k: (k.created_at, k.id))

    @_redis_errors
    async def revoke_key(self, key_id: str) -> bool:
        key_hash = await self._redis.get(self._names.apikey_id(key_id))
        if key_hash is None:
            return False
        # HSETNX: the first revocation's time stands; the hash exists (keys are never deleted).
        await self._redis.hsetnx(self._names.apikey(key_hash), "revoked_at", repr(self._clock()))
        return True

    # --- rate limits ---

    @_redis_errors
    async def check_and_consume(
        self, key_id: str, rpm: int | None, tpm: int | None, tokens_estimate: int, now: float | None = None
    ) -> LimitDecision:
        check_limit_args(key_id, rpm, tpm, tokens_estimate)
        if rpm is None and tpm is None:
            return ALLOWED
        # The script names the window counters itself, from Redis's clock unless a time is given.
        rpm_retry, tpm_retry = await self._scripts["CHECK_AND_CONSUME"](
            keys=[],
            args=["" if now is None else to_ms(now), WINDOW_MS, "" if rpm is None else rpm,
                  "" if tpm is None else tpm, tokens_estimate, self._names.limit_scope(key_id, "rpm"),
                  self._names.limit_scope(key_id, "tpm")],
        )
        if rpm_retry == 0 and tpm_retry == 0:
            return ALLOWED
        return refused(rpm_retry or None, tpm_retry or None)

    @_redis_errors
    async def reconcile_tokens(self, key_id: str, estimate: int, actual: int, now: float | None = None) -> None:
        check_id("key id", key_id)
        check_count("estimate", estimate)
        check_count("actual", actual)
        if actual == estimate:
            return
        await self._scripts["RECONCILE_TOKENS"](
            keys=[],
            args=[actual - estimate, "" if now is None else to_ms(now), WINDOW_MS,
                  self._names.limit_scope(key_id, "tpm")],
        )

    # --- requests in flight per tenant ---

    @_redis_errors
    async def acquire_request_slot(self, tenant_id: str, request_id: str, limit: int) -> bool:
        check_id("tenant id", tenant_id)
        check_text("request id", request_id)
        check_count("limit", limit, positive=True)
        self._lease.start()
        granted = await self._scripts["ACQUIRE_SLOT"](
            keys=[self._names.request_slots(tenant_id)], args=[request_id, limit, self._lease_ms()]
        )
        if granted:
            self._slots.setdefault(tenant_id, set()).add(request_id)
        return bool(granted)

    @_redis_errors
    async def release_request_slot(self, tenant_id: str, request_id: str) -> None:
        check_id("tenant id", tenant_id)
        held = self._slots.get(tenant_id)
        if held is not None:
            held.discard(request_id)
            if not held:
                del self._slots[tenant_id]
        await self._redis.zrem(self._names.request_slots(tenant_id), request_id)

    # --- budgets ---

    @_redis_errors
    async def reserve_budget(
        self, tenant_id: str, month: str, amount_micro: int, budget_micro: int | None
    ) -> BudgetDecision:
        check_reservation(tenant_id, month, amount_micro, budget_micro)
        spend_key, token_key = self._names.budget(tenant_id, month), self._names.budget_token(token_hex(12))
        try:
            allowed, spent = await self._scripts["RESERVE_BUDGET"](
                keys=[spend_key, token_key],
                args=[amount_micro, "" if budget_micro is None else budget_micro, _BUDGET_TTL_S, _TOKEN_TTL_S],
            )
        except PoolExhausted:
            raise  # never sent
        except (RedisConnectionError, RedisTimeoutError, asyncio.CancelledError):
            # Sent, perhaps applied (or about to be): nobody will settle it, so it is taken back, or
            # stopped before it lands, in the background (redis_undo).
            self._undo.add(spend_key, token_key)
            raise
        return BudgetDecision(allowed=bool(allowed), spent_micro=int(spent))

    @_redis_errors
    async def settle_budget(self, tenant_id: str, month: str, reserved_micro: int, actual_micro: int) -> int:
        check_settlement(tenant_id, month, reserved_micro, actual_micro)
        spent = await self._scripts["SETTLE_BUDGET"](
            keys=[self._names.budget(tenant_id, month)], args=[actual_micro - reserved_micro, _BUDGET_TTL_S]
        )
        return int(spent)

    @_redis_errors
    async def budget_spent(self, tenant_id: str, month: str) -> int:
        check_id("tenant id", tenant_id)
        return int(await self._redis.get(self._names.budget(tenant_id, check_month(month))) or 0)

    # --- sessions ---

    @_redis_errors
    async def get_session(self, tenant_id: str, session_id: str) -> str | None:
        check_id("tenant id", tenant_id)
        session: str | None = await self._redis.get(self._names.session(tenant_id, check_text("session id", session_id)))
        return session

    @_redis_errors
    async def set_session(self, tenant_id: str, session_id: str, backend_id: str) -> None:
        check_id("tenant id", tenant_id)
        key = self._names.session(tenant_id, check_text("session id", session_id))
        await self._redis.set(key, check_text("backend id", backend_id), px=_ms(self._settings.session_ttl_s))

    @_redis_errors
    async def delete_session(self, tenant_id: str, session_id: str) -> None:
        check_id("tenant id", tenant_id)
        await self._redis.delete(self._names.session(tenant_id, check_text("session id", session_id)))

    # --- prefix index ---

    @_redis_errors
    async def record_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        check_text("backend id", backend_id)
        hashes = [str(h) for h in dict.fromkeys(check_hashes(block_hashes))]
        if not hashes:
            return
        s, n = self._settings, self._names
        await self._scripts["RECORD_PREFIX"](
            keys=[n.prefix_lru(), *(n.prefix_hash(h) for h in hashes)],
            args=[backend_id, to_us(self._clock()), to_us(s.prefix_index_ttl_s), _ms(s.prefix_index_ttl_s),
                  s.prefix_index_max_entries, n.prefix_hash(), *hashes],
        )

    @_redis_errors
    async def remove_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        hashes = [str(h) for h in dict.fromkeys(check_hashes(block_hashes))]
        if hashes:
            keys = [self._names.prefix_lru(), *(self._names.prefix_hash(h) for h in hashes)]
            await self._scripts["REMOVE_PREFIX"](keys=keys, args=[backend_id, *hashes])

    @_redis_errors
    async def match_prefix(self, block_hashes: Sequence[int]) -> dict[str, int]:
        hashes = check_hashes(block_hashes)
        if not hashes:
            return {}
        fresh = f"({to_us(self._clock()) - to_us(self._settings.prefix_index_ttl_s)}"
        flat = await self._scripts["MATCH_PREFIX"](keys=[self._names.prefix_hash(h) for h in hashes], args=[fresh])
        return {flat[i]: int(flat[i + 1]) for i in range(0, len(flat), 2)}

    # --- in-flight tokens ---

    def _inflight_keys(self) -> list[str]:
        n = self._names
        return [n.inflight(self._replica, "prefill"), n.inflight(self._replica, "decode"), n.inflight_replicas()]

    async def add_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        await self._change_inflight(backend_id, prefill_tokens, decode_tokens, sign=1)

    async def release_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        await self._change_inflight(backend_id, prefill_tokens, decode_tokens, sign=-1)

    @_redis_errors
    async def _change_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int, sign: int) -> None:
        check_tokens(backend_id, prefill_tokens, decode_tokens)
        self._lease.start()
        await self._scripts["CHANGE_INFLIGHT"](
            keys=self._inflight_keys(),
            args=[backend_id, sign * prefill_tokens, sign * decode_tokens, self._lease_ms(), self._replica],
        )

    @_redis_errors
    async def correct_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        check_tokens(backend_id, prefill_tokens, decode_tokens)
        self._lease.start()
        await self._scripts["CORRECT_INFLIGHT"](
            keys=self._inflight_keys(),
            args=[backend_id, prefill_tokens, decode_tokens, self._lease_ms(), self._replica, self._names.inflight()],
        )

    @_redis_errors
    async def loads(self) -> dict[str, tuple[int, int]]:
        n = self._names
        replicas = sorted(await self._redis.smembers(n.inflight_replicas()))
        async with self._redis.pipeline(transaction=False) as pipe:
            for r in replicas:
                pipe.hgetall(n.inflight(r, "prefill"))
                pipe.hgetall(n.inflight(r, "decode"))
            rows = await pipe.execute()
        totals: dict[str, list[int]] = {}
        for i, r in enumerate(replicas):
            prefill, decode = rows[2 * i], rows[2 * i + 1]
            if not prefill and not decode:  # lease ran out (or nothing in flight): forget the replica
                await self._scripts["PRUNE_REPLICA"](
                    keys=[n.inflight_replicas(), n.inflight(r, "prefill"), n.inflight(r, "decode")], args=[r]
                )
            for column, counts in enumerate((prefill, decode)):
                for backend, tokens in counts.items():
                    totals.setdefault(backend, [0, 0])[column] += int(tokens)
        return {b: (p, d) for b, (p, d) in totals.items() if p or d}

    def _lease_ms(self) -> int:
        return _ms(self._settings.inflight_lease_s)

    async def _renew_lease(self) -> None:
        n = self._names
        while True:
            await asyncio.sleep(self._settings.inflight_lease_s / 3)
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.pexpire(n.inflight(self._replica, "prefill"), self._lease_ms())
                    pipe.pexpire(n.inflight(self._replica, "decode"), self._lease_ms())
                    pipe.sadd(n.inflight_replicas(), self._replica)
                    await pipe.execute()
                for tenant_id, held in list(self._slots.items()):
                    await self._scripts["RENEW_SLOTS"](
                        keys=[n.request_slots(tenant_id)], args=[self._lease_ms(), *held]
                    )
            except RedisError:
                continue  # Redis is down (or full) for everyone; try again next period

    # --- server-side secrets ---

    @_redis_errors
    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        key = self._names.secret(check_id("secret name", name))
        # one atomic script: set if absent (no TTL: it outlives every replica), then read what won
        return str(await self._redis.eval(_SET_IF_ABSENT_THEN_GET, 1, key, candidate))

    # --- ledger ---

    @_redis_errors
    async def append_usage(self, record: UsageRecord) -> bool:
        if not isinstance(record, UsageRecord):
            raise TypeError(f"append_usage takes a UsageRecord, got {type(record).__name__}")
        return await self._ledger.append(record)

    async def iter_usage(self, start: float, end: float, tenant_id: str | None = None) -> AsyncIterator[UsageRecord]:
        try:
            async for record in self._ledger.iter_usage(start, end, tenant_id):
                yield record
        except RedisError as exc:
            converted = _store_error(exc)
            if converted is None:
                raise
            raise converted from exc

    @_redis_errors
    async def get_usage(self, request_id: str) -> UsageRecord | None:
        return await self._ledger.get_usage(request_id)

    @_redis_errors
    async def archive_ledger(self, older_than: float) -> int:
        return await self._ledger.archive_before(older_than)

    # --- lifecycle ---

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._lease.stop()
        await self._undo.aclose(_UNDO_CLOSE_WAIT_S)  # before the connections go
        try:  # our in-flight requests end with us
            await self._redis.delete(*self._inflight_keys()[:2])
            await self._redis.srem(self._names.inflight_replicas(), self._replica)
            for tenant_id, held in self._slots.items():
                await self._redis.zrem(self._names.request_slots(tenant_id), *held)
        except RedisError:
            pass  # the lease drops them anyway
        await self._ledger.aclose()
        await self._redis.aclose()
        await self._pool.disconnect()  # a pool passed in is the caller's to close


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))
