"""The shared-state contract every gateway module codes against.

Four implementations pass the same tests: `EmbeddedStore` (one process: memory + SQLite),
`HostedStore` (several gateway processes on one machine calling one store host process, which
keeps an `EmbeddedStore`: gateway/store/host/), `SharedEmbeddedStore` (several gateway processes
on one machine sharing the SQLite file) and `RedisStore` (several gateway replicas on one Redis).
Open one with `gateway.store.open_store(settings)` and `await store.aclose()` at shutdown.

Rules that hold for all:
- every check-and-change is atomic across all replicas sharing the store (N replicas never
  allow N x a limit or a budget);
- every collection is bounded (size cap, TTL or both) except the ledger, which is the record
  of money and is only ever appended to (the Redis store moves old records to a durable archive
  rather than deleting them: `archive_ledger`);
- bad arguments raise `InvalidArgument` (a ValueError) naming the argument; an unreachable Redis
  (or store host) raises `StoreUnavailable`; nothing else escapes (see `gateway.store.errors`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterable, Sequence

from gateway.store.models import ApiKey, BudgetDecision, LimitDecision, Tenant, UsageRecord


class Store(ABC):
    # True when every lookup is answered from this process's memory without waiting (the embedded
    # store): callers then await them one by one rather than concurrently, one task each saved.
    answers_in_memory = False

    # --- tenants ---

    @abstractmethod
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
        """Create a tenant owning `account_ids` (a random id unless `tenant_id` is given).

        Raises Conflict if the tenant id exists or any account is owned by another tenant;
        nothing is written in that case.
        """

    @abstractmethod
    async def get_tenant(self, tenant_id: str) -> Tenant | None:
        """The tenant, or None."""

    @abstractmethod
    async def get_tenant_by_account(self, account_id: str) -> Tenant | None:
        """The tenant owning `account_id`, or None."""

    @abstractmethod
    async def list_tenants(self) -> list[Tenant]:
        """Every tenant, oldest first (ties by id)."""

    # --- API keys ---

    @abstractmethod
    async def create_key(
        self,
        tenant_id: str,
        *,
        allowed_models: Iterable[str] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
    ) -> tuple[ApiKey, str]:
        """Create a key for an existing tenant; returns the key and its secret.

        The secret is returned only here: the store keeps its SHA-256 hash. Raises NotFound
        for an unknown tenant.
        """

    @abstractmethod
    async def lookup_key(self, secret: str) -> ApiKey | None:
        """The key a presented secret belongs to, or None if unknown or revoked.

        Found by hash and confirmed with a constant-time comparison. A revocation is seen by every
        replica within one second: the Redis store reads keys from Redis on every lookup; the
        embedded store sees its own revocations at once and another process's (the CLI on the
        same SQLite file) within `sqlite_refresh_s`. Requests admitted before a revocation run to
        their end (SECURITY.md, "Key revocation").
        """

    @abstractmethod
    async def get_key(self, key_id: str) -> ApiKey | None:
        """The key by id (revoked ones included), or None."""

    @abstractmethod
    async def list_keys(self, tenant_id: str) -> list[ApiKey]:
        """The tenant's keys, revoked ones included, oldest first. Never hashes or secrets."""

    @abstractmethod
    async def revoke_key(self, key_id: str) -> bool:
        """Revoke a key at once; False if there is no such key (revoking twice returns True)."""

    # --- rate limits (sliding window, `policies.limits`) ---

    @abstractmethod
    async def check_and_consume(
        self, key_id: str, rpm: int | None, tpm: int | None, tokens_estimate: int, now: float | None = None
    ) -> LimitDecision:
        """Atomically decide one request against the key's per-minute limits and count it if allowed.

        `now` (epoch seconds) is for tests; None, what the gateway passes, is the store's own clock:
        Redis's `TIME` (read inside the script, so replicas with skewed clocks share one window) or
        the embedded store's clock.

        `rpm`/`tpm` None means unlimited. A refused request counts nothing; `retry_after_s` is when
        the same request would first fit and `which` names the refusing limit (the one that frees
        later when both refuse). Raises TokensOverLimit when `tokens_estimate` alone exceeds `tpm`.
        """

    @abstractmethod
    async def reconcile_tokens(self, key_id: str, estimate: int, actual: int, now: float | None = None) -> None:
        """After the response, replace the estimate counted by `check_and_consume` with the actual tokens.

        The difference is applied to the current minute's window (a refund larger than it spills into
        the previous window); counters never go below zero. A no-op when they are equal.
        """

    # --- requests in flight per tenant ---

    @abstractmethod
    async def acquire_request_slot(self, tenant_id: str, request_id: str, limit: int) -> bool:
        """Atomically count `request_id` as in flight for the tenant if fewer than `limit` are; False
        (nothing counted) when the tenant is at its limit. Acquiring a slot already held is True.

        A replica that stops without releasing (a crash) frees its slots within `inflight_lease_s`.
        """

    @abstractmethod
    async def release_request_slot(self, tenant_id: str, request_id: str) -> None:
        """Free the request's slot (any replica may; releasing twice is a no-op)."""

    # --- monthly budgets ---

    @abstractmethod
    async def reserve_budget(
        self, tenant_id: str, month: str, amount_micro: int, budget_micro: int | None
    ) -> BudgetDecision:
        """Atomically add `amount_micro` to the tenant's spend for `month` ("YYYY-MM") if it stays within budget.

        `budget_micro` None means unlimited (the spend is still counted). A refusal changes nothing.
        """

    @abstractmethod
    async def settle_budget(self, tenant_id: str, month: str, reserved_micro: int, actual_micro: int) -> int:
        """Replace a reservation with the actual cost; returns the month's spend (never below zero)."""

    @abstractmethod
    async def budget_spent(self, tenant_id: str, month: str) -> int:
        """The month's spend so far, reservations included."""

    # --- session affinity ---

    @abstractmethod
    async def get_session(self, tenant_id: str, session_id: str) -> str | None:
        """The backend a tenant's session last went to, or None (unknown or expired)."""

    @abstractmethod
    async def set_session(self, tenant_id: str, session_id: str, backend_id: str) -> None:
        """Pin the session to `backend_id` for `session_ttl_s` from now (each call renews it)."""

    @abstractmethod
    async def delete_session(self, tenant_id: str, session_id: str) -> None:
        """Forget the session (e.g. its backend went away)."""

    # --- prefix index: block hash -> backends holding that block ---

    @abstractmethod
    async def record_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        """Note that `backend_id` holds these blocks now (renewing their TTL and LRU position).

        The index keeps at most `prefix_index_max_entries` hashes, dropping the least recently
        recorded first, and forgets a (hash, backend) pair not recorded for `prefix_index_ttl_s`.
        """

    @abstractmethod
    async def remove_prefix(self, backend_id: str, block_hashes: Sequence[int]) -> None:
        """Note that `backend_id` evicted these blocks."""

    @abstractmethod
    async def match_prefix(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """For each backend, how many leading blocks of this chain it holds (backends with 0 left out)."""

    # --- in-flight tokens per backend ---

    @abstractmethod
    async def add_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        """Count tokens this replica just sent to `backend_id` (both >= 0)."""

    @abstractmethod
    async def release_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        """Uncount tokens that finished (both >= 0); counters stop at zero, never below."""

    @abstractmethod
    async def correct_inflight(self, backend_id: str, prefill_tokens: int, decode_tokens: int) -> None:
        """Align the backend's totals with its own report (GET /load) where the counts drifted.

        After the call `loads()[backend_id]` equals the report, except that it never drops below
        what other live replicas still hold for that backend.
        """

    @abstractmethod
    async def loads(self) -> dict[str, tuple[int, int]]:
        """backend id -> (prefill, decode) tokens in flight, summed over live gateway replicas.

        A replica that stops without closing the store (crash) stops counting after
        `inflight_lease_s`; backends at (0, 0) are left out.
        """

    # --- ledger ---

    @abstractmethod
    async def append_usage(self, record: UsageRecord) -> bool:
        """Append a usage record exactly once; False (and nothing written) if its request_id exists."""

    @abstractmethod
    def iter_usage(self, start: float, end: float, tenant_id: str | None = None) -> AsyncIterator[UsageRecord]:
        """Records with start <= ended_at < end (optionally one tenant's), by (ended_at, request_id).

        Ordered on the end time in whole microseconds, then request_id; read in pages, so a long
        range does not load at once.
        """

    @abstractmethod
    async def get_usage(self, request_id: str) -> UsageRecord | None:
        """One record by request id, or None."""

    # --- server-side secrets ---

    @abstractmethod
    async def get_or_create_secret(self, name: str, candidate: str) -> str:
        """The secret stored under `name`; if there is none yet, `candidate` is stored and returned.

        Atomic set-if-absent: replicas racing at first start all get the one value that won, and
        it survives restarts (SQLite file, Redis key without TTL), so every gateway derives the
        same values from it without configuration (e.g. the tenant cache salt, gateway/pipeline/tenant_salt.py).
        """

    async def archive_ledger(self, older_than: float) -> int:
        """Move ledger records that ended before `older_than` from memory to durable storage, where
        reads still find them; returns how many moved. The embedded store's ledger is on disk
        already (0); the Redis store's is `redis_ledger`'s retention."""
        return 0

    # --- lifecycle ---

    @abstractmethod
    async def aclose(self) -> None:
        """Release connections, files and background tasks; this replica's in-flight counts are dropped."""
