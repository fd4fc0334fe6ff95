"""The HTTP layer's settings section `[http]`: listeners, admin API, metrics, bodies, drain and
worker processes (what one connection may cost a listener is `[listener_limits]`,
gateway/http/listener_limits.py). Each field is also accepted by its own name, e.g.
`EDGERUN_PORT`, as gateway/settings.py explains."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from contracts.settings import check_secret
from gateway.http.admin_guard import MIN_ADMIN_TOKEN_CHARS


class HttpSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Gateway processes serving `port` together (`edgerun serve --workers N`, cli/workers.py), each
    # binding it with SO_REUSEPORT. They share the store: Redis, else the SQLite file in its shared
    # mode (`sqlite_shared`, set for them).
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
    # Connections the kernel queues for a listener before it accepts them (uvicorn's default is 2048);
    # the kernel caps it at net.core.somaxconn. A burst larger than this loses SYNs, which clients
    # resend only after 1 s, 3 s, 7 s... (RELIABILITY.md, Load).
    listen_backlog: int = Field(default=8192, ge=1)
    # /metrics on the public listener (no admin_port) needs `Authorization: Bearer <metrics_token>`
    # unless metrics_public; with neither it is refused (401).
    metrics_token: SecretStr | None = None
    metrics_public: bool = False
    # Guards /admin/v1/* (`Authorization: Bearer <token>` only; at least 32 characters); None turns the
    # admin API off. A client address with admin_max_failures wrong tokens within admin_failure_window_s
    # is refused (429, code 971) until the oldest failure is that old (gateway/http/admin_guard.py).
    admin_token: SecretStr | None = None
    admin_max_failures: int = Field(default=10, ge=1)
    admin_failure_window_s: float = Field(default=60.0, gt=0)
    max_body_bytes: int = Field(default=1 << 20, ge=1024)  # larger bodies get 413 / code 3006
    # Usage queries of one tenant's keys the dashboard API runs at once in this process; more get 429 / 3040
    # (gateway/http/dashboard/limits.py). Each dashboard call also counts against the key's rpm.
    dashboard_max_concurrent_queries: int = Field(default=2, ge=1)
    # SIGTERM / SIGINT: new requests get 503 while those in flight finish, for at most this long;
    # streams still open then are cut (and billed for what was generated) (gateway/http/drain.py)
    shutdown_timeout_s: float = Field(default=30.0, gt=0)

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

