"""Settings of a gateway process: one frozen object built at start-up and passed down.

Sources, highest first: constructor arguments, `EDGERUN_*` environment variables (e.g.
`EDGERUN_REDIS_URL=redis://10.0.0.5:6379/0`), the TOML file named by `EDGERUN_CONFIG`, then
the defaults here. Fields are grouped by the part of the gateway that reads them.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from contracts.settings import TomlSettings, check_secret
from gateway.billing.prices import default_prices
from gateway.fleet.catalog import BackendSpec, ModelSpec, default_models
from gateway.http.admin_guard import MIN_ADMIN_TOKEN_CHARS


class GatewaySettings(TomlSettings):
    # --- shared state (gateway/store) ---
    # Redis URL for several gateway replicas; None keeps everything in this process + SQLite.
    redis_url: str | None = None
    redis_timeout_s: float = Field(default=2.0, gt=0)  # connect and per-command socket timeout
    # SQLite file of the embedded store (tenants, key hashes, budgets, ledger); ":memory:" for tests.
    sqlite_path: str = str(Path.home() / ".local" / "share" / "edgerun" / "gateway.sqlite3")
    # The embedded store re-reads tenants and keys that another process (`edgerun keys revoke` on the
    # same file) committed, at most this long after the last check: the staleness of a CLI revocation.
    sqlite_refresh_s: float = Field(default=0.5, gt=0, le=1.0)
    # Keep limits, budgets, request slots, in-flight counts, sessions and the prefix index in the
    # SQLite file rather than in this process's memory, so several gateway processes on this machine
    # can share them (gateway/store/embedded_shared.py). Always on when workers > 1 without Redis.
    sqlite_shared: bool = False
    # How long a write to the SQLite file waits for another process's (then 503 / StoreUnavailable).
    sqlite_busy_timeout_s: float = Field(default=5.0, gt=0)
    key_prefix: str = Field(default="edgerun:", min_length=1)  # namespace of every Redis key
    replica_id: str | None = None  # names this replica's in-flight counters; None: host-pid-random
    session_ttl_s: float = Field(default=1800.0, gt=0)  # x-session-affinity -> backend stickiness
    session_max_entries: int = Field(default=100_000, ge=1)  # embedded store's bound
    prefix_index_max_entries: int = Field(default=200_000, ge=1)  # block hashes kept
    prefix_index_ttl_s: float = Field(default=600.0, gt=0)  # a block not seen for this long is dropped
    inflight_lease_s: float = Field(default=15.0, gt=0)  # a crashed replica's counts vanish after this

    # --- HTTP gateway (gateway/http/app.py and the services it builds) ---
    # Gateway processes serving `port` together (`edgerun serve --workers N`, cli/workers.py), each
    # binding it with SO_REUSEPORT. They share the store: Redis, or the SQLite file (WAL) of the
    # embedded store in its shared mode (`sqlite_shared`).
    workers: int = Field(default=1, ge=1, le=256)
    # Set by the supervisor for each worker (0..workers-1); named in the `x-edgerun-worker` response
    # header. None: a lone gateway process.
    worker_index: int | None = Field(default=None, ge=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # An optional second listener for /admin/v1/* and /metrics (loopback by default); when set, those
    # paths answer 404 on the public listener (gateway/http/listeners.py).
    admin_host: str = "127.0.0.1"
    admin_port: int | None = Field(default=None, ge=0, le=65535)
    # /metrics on the public listener (no admin_port) needs `Authorization: Bearer <metrics_token>`
    # unless metrics_public; with neither it is refused (401).
    metrics_token: SecretStr | None = None
    metrics_public: bool = False
    # What one connection may cost a listener (gateway/http/listener_limits.py): 414 / 431 / 408 / 503.
    max_request_line_bytes: int = Field(default=8192, ge=256)
    max_header_bytes: int = Field(default=32_768, ge=1024)
    max_headers: int = Field(default=100, ge=8)
    headers_timeout_s: float = Field(default=10.0, gt=0)  # from connect (or the last response) to the headers' end
    body_timeout_s: float = Field(default=60.0, gt=0)  # from the headers' end to the body's end
    keep_alive_s: float = Field(default=5.0, gt=0)  # an idle kept-alive connection is closed after this
    max_connections_per_client: int = Field(default=64, ge=1)  # per client address, per listener
    max_connections: int = Field(default=10_000, ge=1)  # per listener
    # Connections the kernel queues for a listener before it accepts them (uvicorn's default is 2048);
    # the kernel caps it at net.core.somaxconn. A burst larger than this loses SYNs, which clients
    # resend only after 1 s, 3 s, 7 s... (RELIABILITY.md, Load).
    listen_backlog: int = Field(default=8192, ge=1)
    region: str = Field(default="local", min_length=1)  # this gateway's region: tried first
    region_fallbacks: list[str] = Field(default_factory=list)  # other regions, nearest first
    routing_policy: str = "cache_aware"  # round_robin, least_tokens, session_hash, prefix_threshold, cache_aware
    routing_params: dict[str, float] = Field(default_factory=dict)  # e.g. {"load_weight": 1.0}
    models: list[ModelSpec] = Field(default_factory=default_models)
    # public model name -> a model id above, e.g. {"@cf/meta/llama-3.1-8b-instruct" =
    # "@cf/huggingface/smollm2-135m-instruct"}: clients defaulting to that name run the served model
    model_aliases: dict[str, str] = Field(default_factory=dict)
    backends: list[BackendSpec] = Field(default_factory=list)
    # model id -> price in policies.pricing's config form, e.g.
    # {"version": "2026-01", "input": "0.60", "cached_input": "0.10", "output": "3"} (per 1M tokens);
    # a model without one is metered at cost 0 (price version "unpriced"). The default prices the
    # default model (gateway/billing/prices.py), so `edgerun dev` meters real amounts.
    prices: dict[str, dict[str, str | int]] = Field(default_factory=default_prices)
    # Guards /admin/v1/* (`Authorization: Bearer <token>` only; at least 32 characters); None turns the
    # admin API off. A client address with admin_max_failures wrong tokens within admin_failure_window_s
    # is refused (429, code 971) until the oldest failure is that old (gateway/http/admin_guard.py).
    admin_token: SecretStr | None = None
    admin_max_failures: int = Field(default=10, ge=1)
    admin_failure_window_s: float = Field(default=60.0, gt=0)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)  # larger bodies get 413 / code 3006
    # Large bodies are parsed, and large prompts templated and tokenized, on this many worker threads
    # (gateway/pipeline/offload.py); with offload_max_pending jobs waiting or running, more get 429 / 3040.
    offload_threads: int = Field(default=2, ge=1)
    offload_max_pending: int = Field(default=64, ge=1)
    # Requests doing their CPU-bound setup (template, tokenize, limits, route) at once; the others wait
    # in arrival order, so a burst of thousands never makes one turn of the event loop last seconds
    # (gateway/pipeline/setup_gate.py).
    setup_concurrency: int = Field(default=32, ge=1)
    tokenizer_cache_dir: Path | None = Path.home() / ".cache" / "edgerun" / "tokenizers"
    health_interval_s: float = Field(default=2.0, gt=0)  # GET /health of every backend
    # failed health checks in a row that mark a backend down (a request that fails to reach it does at once)
    health_fall: int = Field(default=3, ge=1)
    load_interval_s: float = Field(default=1.0, gt=0)  # GET /load: corrects the in-flight counters
    kv_events_interval_s: float = Field(default=1.0, gt=0)  # POST /kv_cache_events -> prefix index
    # Disaggregated serving (gateway/pipeline/disagg.py; backends with roles prefill / decode): a request whose
    # decode backend lacks at most this many prompt tokens is prefilled there, without a context step
    # (TensorRT-LLM's conditional disaggregation, max_local_prefill_length)
    disagg_max_local_prefill_length: int = Field(default=0, ge=0)
    # Generation requests open to backends at once from this process; one more is answered 429 / 3040
    # at once (Retry-After), never queued. Health, load and KV-event polls are not counted.
    backend_max_connections: int = Field(default=256, ge=1)
    # Requests of one tenant in flight at once over all replicas, unless the tenant sets its own
    # (`max_concurrent_requests`); None: no default limit. Keeps one tenant from taking every connection.
    tenant_max_concurrent_requests: int | None = Field(default=128, ge=1)
    # Outlier ejection (gateway/fleet/outliers.py, policies/breaker.py): this many failures in a row (refused,
    # reset, 5xx or timed out before the first byte, or a stream broken midway) eject a backend for
    # breaker_ejection_s, doubling with each ejection in a row up to breaker_max_ejection_s; then a
    # passed health check lets it back on trial, and its first completed request readmits it fully.
    breaker_failure_threshold: int = Field(default=3, ge=1)
    breaker_ejection_s: float = Field(default=5.0, gt=0)
    breaker_max_ejection_s: float = Field(default=60.0, gt=0)
    backend_connect_timeout_s: float = Field(default=2.0, gt=0)
    backend_first_byte_timeout_s: float = Field(default=30.0, gt=0)
    backend_read_timeout_s: float = Field(default=60.0, gt=0)  # each wait for the next chunk (a stalled stream)
    # A whole generation, from its arrival: a backend that trickles tokens, each within the read timeout,
    # is cut here (408 / 3007, or an error event once streaming; billed for what was generated).
    request_deadline_s: float = Field(default=600.0, gt=0)
    # Sent as `Authorization: Bearer <key>` on every backend request: the backends' EDGERUN_API_KEY
    # (vLLM's and SGLang's --api-key alike). None sends nothing (backends on loopback only).
    backend_api_key: SecretStr | None = None
    # Keys the per-tenant cache_salt sent to backends (HMAC-SHA256 of the tenant id, gateway/pipeline/tenant_salt.py).
    # None: one is generated on first use and kept in the store, shared by every replica.
    cache_salt_secret: SecretStr | None = None

    @field_validator("backend_api_key", "cache_salt_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        return check_secret(value, f"{info.field_name} (EDGERUN_{str(info.field_name).upper()})")

    @field_validator("metrics_token")
    @classmethod
    def _metrics_token_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        return check_secret(value, "metrics_token (EDGERUN_METRICS_TOKEN)")

    @field_validator("admin_token")
    @classmethod
    def _admin_token_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(
                f"admin_token (EDGERUN_ADMIN_TOKEN) must be at least {MIN_ADMIN_TOKEN_CHARS} characters: "
                "generate one with `openssl rand -hex 32`"
            )
        return value

    # SIGTERM / SIGINT: new requests get 503 while those in flight finish, for at most this long;
    # streams still open then are cut (and billed for what was generated) (gateway/http/drain.py)
    shutdown_timeout_s: float = Field(default=30.0, gt=0)

    log_level: str = "info"
    log_json: bool = True

    # --- billing (gateway/billing) ---
    # Earlier price versions per model, in the form of `prices` (a list per model), kept so that records
    # billed under them can be recomputed and exported with their savings (gateway/billing/prices.py).
    price_history: dict[str, list[dict[str, str | int]]] = Field(default_factory=dict)
    # Append-only JSONL file for usage records the ledger cannot take (Redis down), replayed when it is
    # back; None: named after the store, next to sqlite_path (gateway/billing/spool.py).
    ledger_spool_path: str | None = None
    ledger_spool_replay_interval_s: float = Field(default=5.0, gt=0)  # how often pending records are retried
    # Redis store: the SQLite file that ledger records move to once older than ledger_retention_s, which
    # bounds the ledger's memory in Redis (exports read both). None: Redis keeps the whole ledger.
    ledger_archive_path: str | None = None
    ledger_retention_s: float = Field(default=86_400.0, gt=0)  # how long records stay in Redis
    ledger_archive_interval_s: float = Field(default=300.0, gt=0)  # how often old records are moved
    # How long a usage record's idempotency key lives in Redis: longer than any retry (spool replays
    # after an outage, a crashed request's retry) and than the retention above.
    ledger_idempotency_ttl_s: float = Field(default=2 * 86_400.0, gt=0)

    @model_validator(mode="after")
    def _workers_share_a_store(self) -> GatewaySettings:
        if self.workers > 1 and self.redis_url is None and self.sqlite_path == ":memory:":
            raise ValueError(
                f"workers={self.workers} share the embedded store through its SQLite file: give a file "
                "(EDGERUN_SQLITE_PATH), not ':memory:', or point the gateway at Redis (EDGERUN_REDIS_URL)"
            )
        if self.workers > 1 and self.port == 0:
            raise ValueError("workers > 1 share one port: give a port (not 0)")
        return self

    @model_validator(mode="after")
    def _idempotency_outlives_retention(self) -> GatewaySettings:
        if self.ledger_idempotency_ttl_s <= self.ledger_retention_s:
            raise ValueError(
                f"ledger_idempotency_ttl_s ({self.ledger_idempotency_ttl_s}) must exceed ledger_retention_s "
                f"({self.ledger_retention_s}): a retried record must still be recognised while Redis holds it"
            )
        return self
