"""The fleet's settings section (`[fleet]`): the models and backends served, how backends are
reached (the backend client's timeouts, connections and key), health and load polling, and the
outlier breaker. Each field is also accepted by its own name, e.g. `EDGERUN_BACKENDS`, as
gateway/settings.py explains."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from contracts.settings import check_secret
from gateway.fleet.catalog import BackendSpec, ModelSpec, default_models


class FleetSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    models: list[ModelSpec] = Field(default_factory=default_models)
    # public model name -> a model id above, e.g. {"@cf/meta/llama-3.1-8b-instruct" =
    # "@cf/huggingface/smollm2-135m-instruct"}: clients defaulting to that name run the served model
    model_aliases: dict[str, str] = Field(default_factory=dict)
    backends: list[BackendSpec] = Field(default_factory=list)
    health_interval_s: float = Field(default=2.0, gt=0)  # GET /health of every backend
    # failed health checks in a row that mark a backend down (a request that fails to reach it does at once)
    health_fall: int = Field(default=3, ge=1)
    load_interval_s: float = Field(default=1.0, gt=0)  # GET /load: corrects the in-flight counters
    kv_events_interval_s: float = Field(default=1.0, gt=0)  # POST /kv_cache_events -> prefix index
    # Generation requests open to backends at once from this process; one more is answered 429 / 3040
    # at once (Retry-After), never queued. Health, load and KV-event polls are not counted.
    backend_max_connections: int = Field(default=256, ge=1)
    # Outlier ejection (gateway/fleet/outliers.py, policies/breaker.py): this many failures in a row that
    # are the backend's own eject it for breaker_ejection_s, doubling with each ejection in a row up to
    # breaker_max_ejection_s; then a passed health check lets it back on trial, and its first completed
    # request readmits it fully. Connection failures (refused, reset, timed out) always count; failed
    # answers (5xx, an error event midway) count once per tenant and never one tenant's alone.
    breaker_failure_threshold: int = Field(default=3, ge=1)
    breaker_ejection_s: float = Field(default=5.0, gt=0)
    breaker_max_ejection_s: float = Field(default=60.0, gt=0)
    backend_connect_timeout_s: float = Field(default=2.0, gt=0)
    backend_first_byte_timeout_s: float = Field(default=30.0, gt=0)
    backend_read_timeout_s: float = Field(default=60.0, gt=0)  # each wait for the next chunk (a stalled stream)
    # Sent as `Authorization: Bearer <key>` on every backend request: the backends' EDGERUN_API_KEY
    # (vLLM's and SGLang's --api-key alike). None sends nothing (backends on loopback only).
    backend_api_key: SecretStr | None = None

    @field_validator("backend_api_key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        return check_secret(value, "backend_api_key (EDGERUN_BACKEND_API_KEY)")
