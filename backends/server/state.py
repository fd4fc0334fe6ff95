"""Everything one backend app owns, in one place: settings, engine, admission, metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from backends.server.admission import Admission
from backends.server.errors import ModelNotFound, Unavailable
from backends.server.generation import GenerationService
from backends.server.kv_events import to_trtllm_json
from backends.server.kv_feed import KVEventFeed
from backends.server.metrics import BackendMetrics
from backends.settings import BackendSettings
from contracts.kv_events import KVEvent
from engines.base import Engine, EngineStats

if TYPE_CHECKING:
    from backends.server.kv_service import KVService  # imports torch: only where the engine is ours
    from backends.server.region_service import RegionPoolService


@dataclass(slots=True)
class BackendState:
    settings: BackendSettings
    admission: Admission
    metrics: BackendMetrics = field(init=False)
    kv_feed: KVEventFeed = field(init=False)
    engine: Engine | None = None
    kv: KVService | None = None  # KV transfer of disaggregated serving (built-in engine only)
    region: RegionPoolService | None = None  # the region's shared KV pool (kv_region_pool_master)
    generation: GenerationService | None = None
    load_error: str | None = None
    started_at: int = field(default_factory=lambda: int(time.time()))
    on_fatal: Callable[[BaseException], None] | None = None  # set by serve.py: stop the process
    stopping: asyncio.Future[None] | None = None  # the one graceful shutdown, once begun

    def __post_init__(self) -> None:
        labels = {"model": self.model_name, "region": self.settings.region, "role": self.settings.role}
        self.metrics = BackendMetrics(self.engine_stats, **labels)
        settings = self.settings
        self.kv_feed = KVEventFeed(
            settings.kv_events_capacity, settings.kv_events_max_consumers, settings.kv_events_consumer_ttl_s
        )

    def engine_stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

    @property
    def model_name(self) -> str:
        """The served model id: the configured name ("smollm2", a path, ...), stable across restarts."""
        return self.settings.engine.model if self.settings.engine_kind == "builtin" else self.settings.trtllm.model

    @property
    def service(self) -> GenerationService:
        if self.generation is None:
            raise Unavailable("the backend is still loading its model: retry shortly")
        return self.generation

    def attach(self, engine: Engine) -> None:
        """The engine is started: serve requests with it."""
        self.engine = engine
        self.generation = GenerationService(engine, self.admission, self.metrics, self.region)
        self.admission.mark_ready()

    def ready_engine(self) -> Engine:
        if self.engine is None or not self.admission.is_ready:
            raise Unavailable(f"the backend is {self.admission.phase.value}: retry shortly or use another backend")
        return self.engine

    def default_max_tokens(self, num_prompt_tokens: int) -> int:
        """For requests that set no limit (chat): the rest of the context, within the KV cache."""
        assert self.engine is not None
        room = self.engine.max_model_len - num_prompt_tokens
        if self.settings.engine_kind == "builtin":
            room = min(room, self.settings.engine.num_kv_blocks * self.settings.engine.block_size - num_prompt_tokens)
        return max(1, room)

    def check_model(self, model: str | None) -> None:
        """A request may omit `model`, or name the served model (its id or the configured name)."""
        engine_name = self.engine.model_name if self.engine is not None else None
        if model is None or model in (self.model_name, engine_name):
            return
        message = f"model {model!r} is not served here; this backend serves {self.model_name!r}"
        raise ModelNotFound(message, param="model")

    def adapter_of(self, model: str | None) -> str | None:
        """The LoRA adapter a request's `model` names (vLLM's convention: the adapter's name as the model),
        None for the served base model. Only the built-in engine with a `lora_dir` serves adapters."""
        engine_name = self.engine.model_name if self.engine is not None else None
        if model is None or model in (self.model_name, engine_name):
            return None
        if self.settings.engine_kind != "builtin" or self.settings.engine.lora_dir is None:
            self.check_model(model)  # raises: not the served model, and no adapters here
        return model

    async def unload_adapter(self, name: str) -> bool:
        """Forget LoRA adapter `name` (vLLM's `/v1/unload_lora_adapter`): False when it is not resident here
        (or this backend serves no adapters). Requests running under it finish under it."""
        engine = self.ready_engine()
        if self.settings.engine_kind != "builtin":
            return False
        from engines.builtin.engine.async_engine import AsyncEngine  # imports torch: only where the engine is ours

        assert isinstance(engine, AsyncEngine), "the built-in kind runs an AsyncEngine (engine_factory.py)"
        unloaded: bool = await engine.call(lambda e: e.adapters.unload(name))
        return unloaded

    def kv_events(self, consumer: str | None) -> list[KVEvent]:
        """The KV events `consumer` has not read yet, in TensorRT-LLM's JSON (see kv_feed.py)."""
        if self.engine is None:
            return []
        dropped = self.kv_feed.num_dropped
        events = self.kv_feed.read(consumer, self.engine.drain_kv_events())
        self.metrics.kv_events_dropped.inc(self.kv_feed.num_dropped - dropped)
        include_tokens = self.settings.kv_events_include_tokens
        return [to_trtllm_json(e, self.engine.max_model_len, include_tokens=include_tokens) for e in events]

    def load(self) -> dict[str, Any]:
        """The cheap snapshot the gateway polls (GET /load)."""
        snapshot: dict[str, Any] = {
            "model": self.model_name,
            "region": self.settings.region,
            "role": self.settings.role,
            "status": self.admission.phase.value,
            "in_flight": self.admission.num_active,
            "max_in_flight": self.admission.max_in_flight,
        }
        if self.engine is None:
            return snapshot | {"running": 0, "waiting": 0, "prefill_tokens": 0, "decode_tokens": 0,
                               "kv_blocks_free": 0, "kv_blocks_total": 0}
        stats = self.engine.stats()
        return snapshot | {
            "running": stats.num_running,
            "waiting": stats.num_waiting,
            "prefill_tokens": stats.num_prefill_tokens,
            "decode_tokens": stats.num_decode_tokens,
            "kv_blocks_free": stats.num_kv_blocks_free,
            "kv_blocks_total": stats.num_kv_blocks_total,
            "kv_blocks_pinned": stats.num_kv_blocks_pinned,
            "kv_pins_exported": len(self.kv.exports) if self.kv is not None else 0,
            "kv_tier_hit_blocks": self.tier_hits(stats),
            "adapters": list(stats.resident_adapters),
        }

    def tier_hits(self, stats: EngineStats) -> dict[str, int]:
        """Prompt blocks each tier below the pool supplied so far (none: no tiers)."""
        hits = {}
        if stats.host_tier is not None:
            hits["host"] = stats.host_tier.num_hit_blocks
        if self.metrics.region_tier is not None:
            hits["region"] = self.metrics.region_tier.num_hit_blocks
        return hits
