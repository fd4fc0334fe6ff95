"""The store's settings section (`[store]` in the TOML file; each field also by its own name,
e.g. `EDGERUN_REDIS_URL`, as gateway/settings.py explains)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StoreSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Redis URL for several gateway replicas; None: the local store (this process's memory + the SQLite file).
    redis_url: str | None = None
    redis_timeout_s: float = Field(default=2.0, gt=0)  # connect and per-command socket timeout
    # Connections to Redis per gateway process; a command finding them all busy waits for one, up to
    # redis_timeout_s (then 503). Bounds what N processes x M machines open against Redis's maxclients.
    # A `?max_connections=` in redis_url wins over it (redis-py's query options win over arguments).
    redis_max_connections: int = Field(default=100, ge=1)
    # SQLite file of the local store (tenants, key hashes, budgets, ledger); ":memory:" for tests.
    sqlite_path: str = str(Path.home() / ".local" / "share" / "edgerun" / "gateway.sqlite3")
    # The local store re-reads tenants and keys that another process (`edgerun keys revoke` on the
    # same file) committed, at most this long after the last check: the staleness of a CLI revocation.
    sqlite_refresh_s: float = Field(default=0.5, gt=0, le=1.0)
    # Keep limits, budgets, request slots, in-flight counts, sessions and the prefix index in the
    # SQLite file rather than in this process's memory, so several gateway processes on this machine
    # can share them (gateway/store/local/shared.py): for several `edgerun serve` on one file; the
    # workers of `edgerun serve --workers N` without Redis always do.
    sqlite_shared: bool = False
    # How long a write to the SQLite file waits for another process's (then 503 / StoreUnavailable).
    sqlite_busy_timeout_s: float = Field(default=5.0, gt=0)
    key_prefix: str = Field(default="edgerun:", min_length=1)  # namespace of every Redis key
    replica_id: str | None = None  # names this replica's in-flight counters; None: host-pid-random
    session_ttl_s: float = Field(default=1800.0, gt=0)  # x-session-affinity -> backend stickiness
    session_max_entries: int = Field(default=100_000, ge=1)  # the local store's bound
    prefix_index_max_entries: int = Field(default=200_000, ge=1)  # block hashes kept
    prefix_index_ttl_s: float = Field(default=600.0, gt=0)  # a block not seen for this long is dropped
    inflight_lease_s: float = Field(default=15.0, gt=0)  # a crashed replica's counts vanish after this
    # Redis store: the SQLite file that ledger records move to once older than ledger_retention_s, which
    # bounds the ledger's memory in Redis (exports read both). None: Redis keeps the whole ledger.
    ledger_archive_path: str | None = None
    ledger_retention_s: float = Field(default=86_400.0, gt=0)  # how long records stay in Redis
    ledger_archive_interval_s: float = Field(default=300.0, gt=0)  # how often old records are moved
    # How long a usage record's idempotency key lives in Redis: longer than any retry (spool replays
    # after an outage, a crashed request's retry) and than the retention above.
    ledger_idempotency_ttl_s: float = Field(default=2 * 86_400.0, gt=0)
    # The response cache (gateway/store/cache.py): the most one answer may take (larger ones are not
    # kept), and all of them together (the local store drops the least recently used beyond it, Redis
    # the entries nearest their expiry); 0 keeps nothing. Each entry counts its value's bytes plus 200.
    cache_max_entry_bytes: int = Field(default=1_048_576, ge=1)
    cache_max_bytes: int = Field(default=64 * 1_048_576, ge=0)

    # Several regions (README, "Deploying in several regions"; gateway/store/regional/). Set
    # home_redis_url and this gateway runs in one region of a global deployment: redis_url is this
    # region's own store (limits, budgets spent here, sessions, the prefix index, the ledger as written),
    # and nothing on a request's path leaves the region.
    # The home region's Redis: the global record (the ledger every region ships to, budget leases).
    home_redis_url: str | None = None
    # Where tenants and keys are written (the home region's tenancy Redis, which every region
    # replicates); None: home_redis_url.
    home_tenancy_url: str | None = None
    # This region's read-only Redis replica (REPLICAOF) of home_tenancy_url, which keys are looked up
    # in; None: home_tenancy_url itself (the home region, where it is near).
    tenancy_replica_url: str | None = None
    # The name this region leases budget under at home; None: the gateway's [routing] region.
    region_name: str | None = None
    # A region spends a tenant's monthly budget from leases it takes from home, each this share of the
    # budget (at least what the request needs), and takes the next one in the background once less
    # than half a lease is left. No budget is ever overspent; a region's unspent leases (at most 1.5)
    # are what other regions cannot spend.
    budget_lease_fraction: float = Field(default=0.1, gt=0, le=1.0)
    # How often a region re-reads its leases and checks which ones to renew.
    budget_lease_interval_s: float = Field(default=0.5, gt=0)
    ledger_ship_batch: int = Field(default=200, ge=1)  # ledger records shipped home per round trip

    @model_validator(mode="after")
    def _idempotency_outlives_retention(self) -> StoreSettings:
        if self.ledger_idempotency_ttl_s <= self.ledger_retention_s:
            raise ValueError(
                f"ledger_idempotency_ttl_s ({self.ledger_idempotency_ttl_s}) must exceed ledger_retention_s "
                f"({self.ledger_retention_s}): a retried record must still be recognised while Redis holds it"
            )
        return self

    @model_validator(mode="after")
    def _regions_need_redis(self) -> StoreSettings:
        if self.home_redis_url and not self.redis_url:
            raise ValueError(
                "home_redis_url is set, so this gateway runs in a region: give the region's own Redis "
                "(EDGERUN_REDIS_URL), which its ledger records are shipped home from by a Redis stream"
            )
        for name in ("home_tenancy_url", "tenancy_replica_url", "region_name"):
            if getattr(self, name) is not None and not self.home_redis_url:
                raise ValueError(f"{name} is a setting of a region: set home_redis_url too (or drop {name})")
        return self

    @property
    def is_regional(self) -> bool:
        """One region of several (home_redis_url set)."""
        return self.home_redis_url is not None
