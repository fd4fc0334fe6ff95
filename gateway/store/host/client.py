"""`HostedStore`: a gateway worker's store when a store host serves this machine (`store_socket`).

Every call goes to the host (server.py) over one Unix-socket connection per process, opened on
the first call and opened again on the first call after the host went away. Arguments are
checked by the host's embedded store, so a worker gets the same `InvalidArgument` as a lone
gateway; a host that cannot be reached, or does not answer within `redis_timeout_s +
sqlite_busy_timeout_s` (the host may itself wait that long for the SQLite file), is
`StoreUnavailable`, and so is a socket served by another user than this one (checked on each new
connection before anything is sent: the calls carry API keys). What the host applied after its
caller gave up is undone where nothing else would: a request slot is released right behind the
acquire, a budget reservation given back when its late answer comes (`reserve_budget`). Tenants, which never change once
created, are kept after the first lookup (no round trip for them afterwards). Closing the store closes the connection, and the host frees
this worker's request slots and in-flight tokens at once, as it does when the worker dies.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from functools import partial
from typing import Any

import structlog

from gateway.store import errors
from gateway.store.base import Store
from gateway.store.checks import check_id
from gateway.store.host import codec, socket_file
from gateway.store.host.connection import HostConnection
from gateway.store.models import ApiKey, BudgetDecision, LimitDecision, Tenant, UsageRecord, copied, to_us
from gateway.store.settings import StoreSettings
from gateway.store.sqlite_db import USAGE_PAGE

log = structlog.get_logger("edgerun.store.host")


class HostedStore(Store):
    answers_in_memory = False  # every answer is a round trip to the host

    def __init__(self, settings: StoreSettings) -> None:
        if not settings.store_socket:
            raise ValueError("a hosted store needs store_socket: the path of the store host's socket")
        self._path = settings.store_socket
        self._timeout_s = settings.redis_timeout_s + settings.sqlite_busy_timeout_s
        self._connection: HostConnection | None = None
        self._connecting: asyncio.Task[HostConnection] | None = None
        self._closed = False
        # Tenants are only ever added, never changed (no store call changes or deletes one), so a
        # tenant seen once is current: later lookups of it cost no round trip (one per request).
        self._tenants: dict[str, Tenant] = {}
        self._accounts: dict[str, str] = {}  # account id -> tenant id

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return await (await self._connected()).call(method, args, kwargs)

    async def _connected(self) -> HostConnection:
        """The open connection, or a new one."""
        connection = self._connection
        if connection is None or connection.is_closed:
            connection = await self._connect()
        return connection

    async def _connect(self) -> HostConnection:
        """The open connection, or a new one (callers meanwhile share the attempt)."""
        if self._closed:
            raise errors.StoreUnavailable("this store is closed")
        if self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._open())
            self._connecting.add_done_callback(self._attempted)
        return await asyncio.shield(self._connecting)

    def _attempted(self, attempt: asyncio.Task[HostConnection]) -> None:
        """Forget a finished attempt (even one whose callers all left), so the next `_connect`
        after this connection closes opens a new one."""
        if self._connecting is attempt:
            self._connecting = None
        if not attempt.cancelled():
            attempt.exception()  # retrieved: a failure nobody awaited is not reported as lost

    async def _open(self) -> HostConnection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._timeout_s):
                transport, connection = await loop.create_unix_connection(
                    lambda: HostConnection(self._path, self._timeout_s), self._path
                )
        except (OSError, TimeoutError) as exc:
            raise errors.StoreUnavailable(
                f"the store host at {self._path} cannot be reached ({exc}); is `python -m gateway.store.host` running?"
            ) from exc
        uid = socket_file.peer_uid(transport.get_extra_info("socket"))
        if uid is not None and uid != os.getuid():  # not our host: it would see every API key looked up
            transport.abort()
            raise errors.StoreUnavailable(
                f"the process serving {self._path} runs as uid {uid}, not as this user (uid {os.getuid()}): "
                "refusing to use it; put the store socket in a directory only this user can write to"
            )
        self._connection = connection
        return connection

    def _send_and_forget(self, method: str, *args: Any) -> None:
        """Send a call on the open connection, if any, without waiting for its answer."""
        connection = self._connection
        if connection is not None and not connection.is_closed:
            connection.call(method, args, {}).add_done_callback(_ignore)

    # --- tenants ---

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
        return self._seen(codec.tenant(await self._call(
            "create_tenant", name, _listed(account_ids), allowed_models=_listed(allowed_models),
            monthly_budget_micro=monthly_budget_micro, tenant_id=tenant_id,
            max_concurrent_requests=max_concurrent_requests,
        )))  # fmt: skip

    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        if isinstance(tenant_id, str) and (tenant := self._tenants.get(tenant_id)) is not None:
            return copied(tenant)
        found = codec.optional_tenant(await self._call("get_tenant", tenant_id))
        return None if found is None else self._seen(found)

    async def get_tenant_by_account(self, account_id: str) -> Tenant | None:
        if isinstance(account_id, str) and (tenant_id := self._accounts.get(account_id)) is not None:
            return copied(self._tenants[tenant_id])
        found = codec.optional_tenant(await self._call("get_tenant_by_account", account_id))
        return None if found is None else self._seen(found)

    async def list_tenants(self) -> list[Tenant]:
        return [self._seen(codec.tenant(t)) for t in await self._call("list_tenants")]

    def _seen(self, tenant: Tenant) -> Tenant:
        """Remember `tenant` (see `_tenants`) and return it (the caller's copy)."""
        self._tenants[tenant.id] = copied(tenant)
        self._accounts.update((account, tenant.id) for account in tenant.account_ids)
        return tenant

    # --- API keys ---

    async def create_key(
        self,
        tenant_id: str,
        *,
        allowed_models: Iterable[str] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
    ) -> tuple[ApiKey, str]:
        return codec.key_and_secret(
            await self._call("create_key", tenant_id, allowed_models=_listed(allowed_models), rpm=rpm, tpm=tpm)
        )

    async def lookup_key(self, secret: str) -> ApiKey | None:
        return codec.optional_key(await self._call("lookup_key", secret))

    async def get_key(self, key_id: str) -> ApiKey | None:
        return codec.optional_key(await self._call("get_key", key_id))

    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        return [codec.key(k) for k in await self._call("list_keys", tenant_id)]

    async def revoke_key(self, key_id: str) -> bool:
        return bool(await self._call("revoke_key", key_id))

    # --- rate limits ---

    async def check_and_consume(
        self, key_id: str, rpm: int | None, tpm: int | None, tokens_estimate: int, now: float | None = None
    ) -> LimitDecision:
        return codec.limit_decision(await self._call("check_and_consume", key_id, rpm, tpm, tokens_estimate, now))

    async def reconcile_tokens(self, key_id: str, estimate: int, actual: int, now: float | None = None) -> None:
        await self._call("reconcile_tokens", key_id, estimate, actual, now)

    # --- requests in flight per tenant ---

    async def acquire_request_slot(self, tenant_id: str, request_id: str, limit: int) -> bool:
        try:
            return bool(await self._call("acquire_request_slot", tenant_id, request_id, limit))
        except (errors.StoreUnavailable, asyncio.CancelledError):
            # Unanswered in time, or the caller cancelled meanwhile: the host may take the slot (or took
            # it), and nobody would release it while this connection lives: ask for its release now
            # (the host runs one connection's calls in order).
            self._send_and_forget("release_request_slot", tenant_id, request_id)
            raise

    async def release_request_slot(self, tenant_id: str, request_id: str) -> None:
        await self._call("release_request_slot", tenant_id, request_id)

    # --- budgets ---

    async def reserve_budget(
        self, tenant_id: str, month: str, amount_micro: int, budget_micro: int | None
    ) -> BudgetDecision:
        """As the store's; and a reservation the host allowed after its caller stopped waiting (the
        call timed out: StoreUnavailable, the request fails with 503; or it was cancelled) is given
        back, once, on the same connection: nothing else would ever settle it. Never twice with
        Metering's own give-back: Metering shields this call from its caller's cancellation and
        gives back only what this call returned as allowed, which an answer given back here never is.

        The bound: when the connection breaks before the answer comes, the host may have applied
        the reservation or not, and nobody learns which; it then stays in the month's spend
        (over-charged, never under) until the month ends, as the reservations of the requests a
        killed worker was serving do.
        """
        give_back = partial(self._give_back_late, tenant_id, month, amount_micro)
        args = (tenant_id, month, amount_micro, budget_micro)
        connection = await self._connected()
        return codec.budget_decision(await connection.call("reserve_budget", args, {}, late=give_back))

    def _give_back_late(self, tenant_id: str, month: str, amount_micro: int, answer: Any) -> None:
        if codec.budget_decision(answer).allowed:  # on the same connection, behind the reservation
            log.warning("a budget reservation answered late is given back", tenant_id=tenant_id, amount_micro=amount_micro)
            self._send_and_forget("settle_budget", tenant_id, month, amount_micro, 0)

    async def settle_budget(self, tenant_id: str, month: str, reserved_micro: int, actual_micro: int) -> int:
        return int(await self._call("settle_budget", tenant_id, month, reserved_micro, actual_micro))

    async def budget_spent(self, tenant_id: str, month: str) -> int:
        return int(await self._call("budget_spent", tenant_id, month))

    # --- sessions ---

    async def get_session(self, tenant_id: str, session_id: str) -> str | None:
        backend: str | None = await self._call("get_session", tenant_id, session_id)
        return backend

    async def set_session(self, tenant_id: str, session_id: str, backend_id: str) -> None:
        await self._call("set_session", tenant_id, session_id, backend_id)

    async def delete_session(self, tenant_id: str, session_id: str) -> None:
        await self._call("delete_session", tenant_id, session_id)

    # --- prefix index ---

    async def record_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        await self._call("record_prefix", backend_id, _listed(block_hashes))

    async def remove_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        await self._call("remove_prefix", backend_id, _listed(block_hashes))

    async def match_prefix(self, block_hashes: Sequence[int]) -> dict[str, int]:
        matched: dict[str, int] = await self._call("match_prefix", _listed(block_hashes))
        return matched

    # --- in-flight tokens ---

    async def add_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        await self._call("add_inflight", backend_id, prefill_tokens, decode_tokens)

    async def release_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        await self._call("release_inflight", backend_id, prefill_tokens, decode_tokens)

    async def correct_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        await self._call("correct_inflight", backend_id, prefill_tokens, decode_tokens)

    async def loads(self) -> dict[str, tuple[int, int]]:
        return codec.loads(await self._call("loads"))

    # --- ledger ---

    async def append_usage(self, record: UsageRecord) -> bool:
        if not isinstance(record, UsageRecord):
            raise TypeError(f"append_usage takes a UsageRecord, got {type(record).__name__}")
        return bool(await self._call("append_usage", record))

    async def iter_usage(self, start: float, end: float, tenant_id: str | None = None) -> AsyncIterator[UsageRecord]:
        if tenant_id is not None:
            check_id("tenant id", tenant_id)
        after: list[Any] | None = None
        while True:
            page = [codec.record(r) for r in await self._call("usage_page", to_us(start), to_us(end), tenant_id, after)]
            for record in page:
                yield record
            if len(page) < USAGE_PAGE:
                return
            after = [page[-1].ended_us, page[-1].request_id]

    async def get_usage(self, request_id: str) -> UsageRecord | None:
        return codec.optional_record(await self._call("get_usage", request_id))

    async def archive_ledger(self, older_than: float) -> int:
        return int(await self._call("archive_ledger", older_than))

    # --- server-side secrets ---

    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        return str(await self._call("get_or_create_secret", name, candidate))

    # --- lifecycle ---

    async def aclose(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            await asyncio.gather(self._connecting, return_exceptions=True)
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def _ignore(reply: asyncio.Future[Any]) -> None:
    if not reply.cancelled():
        reply.exception()  # retrieved, so asyncio does not report it


def _listed(values: Iterable[Any] | None) -> Any:
    """A collection argument as a JSON list (None and strings as they are: the host refuses a string)."""
    return values if values is None or isinstance(values, str) else list(values)
