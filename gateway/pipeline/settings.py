"""The request pipeline's settings sections: `[routing]` (regions, the policy, the tenants' cache
salt), `[limits]` (how much of the process one request, one tenant or a burst may take),
`[disagg]` (the two-step prefill/decode flow), `[batch]` (the asynchronous batch API) and `[finetunes]`
(tenants' LoRA adapters). Each field
is also accepted by its own name, e.g. `EDGERUN_ROUTING_POLICY`, as gateway/settings.py explains."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from contracts.settings import check_secret


class RoutingSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    region: str = Field(default="local", min_length=1)  # this gateway's region: tried first
    region_fallbacks: list[str] = Field(default_factory=list)  # other regions, nearest first
    routing_policy: str = "cache_aware"  # round_robin, least_tokens, session_hash, prefix_threshold, cache_aware
    routing_params: dict[str, float] = Field(default_factory=dict)  # e.g. {"load_weight": 1.0}
    # Keys the per-tenant cache_salt sent to backends (HMAC-SHA256 of the tenant id, gateway/pipeline/tenant_salt.py).
    # None: one is generated on first use and kept in the store, shared by every replica.
    cache_salt_secret: SecretStr | None = None

    @field_validator("cache_salt_secret")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        return check_secret(value, "cache_salt_secret (EDGERUN_CACHE_SALT_SECRET)")


class LimitSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Requests of one tenant in flight at once over all replicas, unless the tenant sets its own
    # (`max_concurrent_requests`); None: no default limit. Keeps one tenant from taking every connection.
    tenant_max_concurrent_requests: int | None = Field(default=128, ge=1)
    # Large bodies are parsed, and large prompts templated and tokenized, on this many worker threads
    # (gateway/pipeline/offload.py); with offload_max_pending jobs waiting or running, more get 429 / 3040.
    offload_threads: int = Field(default=2, ge=1)
    offload_max_pending: int = Field(default=64, ge=1)
    # Requests doing their CPU-bound setup (template, tokenize, limits, route) at once; the others wait
    # in arrival order, so a burst of thousands never makes one turn of the event loop last seconds
    # (gateway/pipeline/setup_gate.py).
    setup_concurrency: int = Field(default=32, ge=1)
    # A whole generation, from its arrival: a backend that trickles tokens, each within the read timeout,
    # is cut here (408 / 3007, or an error event once streaming; billed for what was generated).
    request_deadline_s: float = Field(default=600.0, gt=0)
    # The most input tokens one embedding request may carry, counted as the gateway admits them before a
    # backend encodes them: UTF-8 bytes + 2 per text (gateway/pipeline/embedding.py). More: 413 / 3006.
    embedding_max_input_tokens: int = Field(default=131_072, ge=1)
    tokenizer_cache_dir: Path | None = Path.home() / ".cache" / "edgerun" / "tokenizers"


class DisaggSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Disaggregated serving (gateway/pipeline/disagg.py; backends with roles prefill / decode): a request whose
    # decode backend lacks at most this many prompt tokens is prefilled there, without a context step
    # (TensorRT-LLM's conditional disaggregation, max_local_prefill_length)
    disagg_max_local_prefill_length: int = Field(default=0, ge=0)


class BatchSettings(BaseModel):
    """Workers AI's asynchronous batch API (`queueRequest`): gateway/pipeline/batch.py, gateway/http/batch_worker.py."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # A batch request's body, at most (Workers AI documents 10 MB); larger: 413 / 3006. A body over
    # max_body_bytes is read this far only with ?queueRequest=true in the URL (the bound holds before reading).
    batch_max_payload_bytes: int = Field(default=10_000_000, ge=1024)
    # A tenant's batch items not answered yet, and their requests' bytes, over every replica; a batch that
    # would pass either: 429 / 3040.
    batch_max_queued_items: int = Field(default=10_000, ge=1)
    batch_max_queued_bytes: int = Field(default=100_000_000, ge=1024)
    batch_results_ttl_s: float = Field(default=86_400.0, gt=0, le=86_400.0)  # answers kept after a batch's last
    batch_concurrency: int = Field(default=4, ge=0)  # items this process runs at once (0: it runs none)
    # Batch items start only while this process's open backend requests are under this share of
    # backend_max_connections: the rest is kept for interactive requests.
    batch_connection_share: float = Field(default=0.5, gt=0, le=1.0)
    batch_lease_s: float = Field(default=30.0, gt=0, le=3600.0)  # a claim's lease, renewed every third of it
    # How often a worker with no room for another item looks again (no store call meanwhile).
    batch_poll_interval_s: float = Field(default=0.5, gt=0)
    # An idle worker waits for an enqueue to wake it (gateway/store/queue.py), and looks at the queue at
    # least this often for what announces itself to nobody: a lapsed lease, an item given back for later.
    batch_idle_poll_s: float = Field(default=5.0, gt=0)
    batch_max_attempts: int = Field(default=3, ge=1)  # claims that lapsed (a worker died) before an item fails


class FinetuneSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # Where uploaded LoRA adapters are kept, one directory per finetune id (PEFT files): the backends must
    # read the same directory (their `lora_dir`: a shared volume). None: the finetunes API answers 400.
    finetunes_dir: Path | None = None
    finetunes_per_account: int = Field(default=100, ge=1)  # Workers AI's limit
    finetune_max_bytes: int = Field(default=300_000_000, ge=1)  # per uploaded file (Workers AI: 300 MB)
    # Routing: a backend that does not have a request's adapter loaded costs this many prompt tokens more
    # (loading it from disk), weighed like a prefix miss (policies/adapters.py)
    adapter_load_cost_tokens: int = Field(default=256, ge=0)
