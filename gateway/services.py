"""The gateway's services, built once from settings and shared by every handler.

`Services.open` wires store, backend client, catalog, tokenizers, monitor, router, auth,
metering and admin; `start` launches the background loops and `aclose` stops them and releases
what this object opened (a store passed in by the caller stays open: the caller owns it).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import structlog

from backends.client import BackendClient
from gateway.billing.metering import Metering
from gateway.billing.retention import archive_forever
from gateway.billing.savings import record_savings
from gateway.billing.spool import LedgerSpool, replay_forever, spool_path
from gateway.errors import GatewayError
from gateway.fleet.catalog import EMBEDDING_TASK, Catalog
from gateway.fleet.kv_index import KVEventIndexer
from gateway.fleet.kv_streams import EngineEventStreams
from gateway.fleet.monitor import BackendMonitor, MonitorIntervals
from gateway.fleet.outliers import OutlierDetector
from gateway.http.admin import AdminService
from gateway.http.admin_guard import AdminGuard
from gateway.http.batch_upkeep import queue_upkeep
from gateway.http.batch_worker import BatchWorker
from gateway.http.drain import Drain
from gateway.metrics import GatewayMetrics
from gateway.pipeline.adapter_unload import AdapterUnloader
from gateway.pipeline.answer_cache import AnswerCache
from gateway.pipeline.auth import Authenticator
from gateway.pipeline.concurrency import TenantSlots
from gateway.pipeline.disagg import Disaggregator
from gateway.pipeline.embedding import Embedder
from gateway.pipeline.finetunes import Finetunes
from gateway.pipeline.generation import Generator
from gateway.pipeline.offload import Offload
from gateway.pipeline.routing import Router
from gateway.pipeline.setup_gate import SetupGate
from gateway.pipeline.tenant_salt import TenantSalts
from gateway.pipeline.ticket import Admitter
from gateway.pipeline.tokenization import TokenizerRegistry
from gateway.settings import GatewaySettings
from gateway.store.factory import Store
from gateway.store.lease import default_replica_id
from policies.breaker import BreakerConfig
from policies.factory import PolicyConfig, build_policy
from policies.pricing import PriceTable
from policies.regions import RegionPreference

log = structlog.get_logger("edgerun.gateway")


@dataclass(slots=True)
class Services:
    settings: GatewaySettings
    metrics: GatewayMetrics
    store: Store
    client: BackendClient
    catalog: Catalog
    monitor: BackendMonitor
    auth: Authenticator
    generator: Generator
    answers: AnswerCache  # generation behind the response cache
    embedder: Embedder
    admin: AdminService
    admin_guard: AdminGuard
    offload: Offload
    kv_streams: EngineEventStreams  # vLLM's and SGLang's KV events over ZMQ
    finetunes: Finetunes  # tenants' LoRA adapters
    owns_store: bool
    owns_client: bool
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    batch_worker: BatchWorker | None = None  # runs queued batch items (gateway/http/batch_worker.py), once started

    @classmethod
    async def open(
        cls,
        settings: GatewaySettings,
        metrics: GatewayMetrics,
        *,
        store: Store | None = None,
        client: BackendClient | None = None,
    ) -> Services:
        fleet, routing, limits, http = settings.fleet, settings.routing, settings.limits, settings.http
        catalog = Catalog.build(fleet.models, fleet.backends, fleet.model_aliases)
        policy = build_policy(PolicyConfig(routing.routing_policy, dict(routing.routing_params)))
        regions = RegionPreference(routing.region, tuple(r for r in routing.region_fallbacks if r != routing.region))
        prices = PriceTable.from_config(settings.billing.prices)
        owns_store = store is None
        if store is None:
            from gateway.store import open_store

            store = open_store(settings.store, record_savings(settings.billing))
        owns_client = client is None
        backend_key = fleet.backend_api_key
        client = client or BackendClient(
            connect_timeout_s=fleet.backend_connect_timeout_s,
            first_byte_timeout_s=fleet.backend_first_byte_timeout_s,
            read_timeout_s=fleet.backend_read_timeout_s,
            api_key=backend_key.get_secret_value() if backend_key is not None else None,
            max_connections=fleet.backend_max_connections,
        )
        block_sizes = {m.block_size for m in catalog.models}
        monitor = BackendMonitor(
            catalog.all_endpoints(),
            client,
            store.routing,
            metrics,
            MonitorIntervals(
                fleet.health_interval_s, fleet.load_interval_s, fleet.kv_events_interval_s, fleet.health_fall
            ),
            kv_sink=(
                KVEventIndexer(store.routing, block_sizes.pop(), {e.id: e.region for e in catalog.all_endpoints()})
                if len(block_sizes) == 1 else None
            ),
            kv_consumer=settings.store.replica_id or default_replica_id(),
            outliers=OutlierDetector(
                [e.id for e in catalog.all_endpoints()],
                BreakerConfig(
                    fleet.breaker_failure_threshold,
                    fleet.breaker_ejection_s,
                    fleet.breaker_max_ejection_s,
                    trial_timeout_s=fleet.backend_first_byte_timeout_s,  # a silent trial has failed by then
                ),
                metrics,
            ),
        )
        auth = Authenticator(store)
        spool = spool_path(settings.billing, settings.store)
        metering = Metering(store, prices, metrics, LedgerSpool(spool) if spool is not None else None)
        salt_secret = routing.cache_salt_secret
        salts = TenantSalts(store.tenancy, salt_secret.get_secret_value() if salt_secret is not None else None)
        router = Router(store.routing, policy, regions, monitor, metrics, salts, settings.finetunes.adapter_load_cost_tokens)
        tokenizers = TokenizerRegistry(limits.tokenizer_cache_dir, client)
        admitter = Admitter(store.admission, metering, TenantSlots(limits.tenant_max_concurrent_requests))
        disagg = Disaggregator(router, client, monitor, metrics, settings.disagg.disagg_max_local_prefill_length)
        offload = Offload(limits.offload_threads, limits.offload_max_pending)
        generator = Generator(
            catalog,
            tokenizers,
            metering,
            router,
            monitor,
            client,
            metrics,
            admitter,
            disagg,
            offload,
            SetupGate(limits.setup_concurrency),
            deadline_s=limits.request_deadline_s,
        )
        return cls(
            settings,
            metrics,
            store,
            client,
            catalog,
            monitor,
            auth,
            generator,
            AnswerCache(store.cache, generator, metering),
            Embedder(catalog, admitter, metering, monitor, client, salts, limits.embedding_max_input_tokens),
            AdminService(store.tenancy),
            AdminGuard(
                http.admin_token.get_secret_value() if http.admin_token is not None else None,
                max_failures=http.admin_max_failures,
                window_s=http.admin_failure_window_s,
            ),
            offload,
            EngineEventStreams(catalog, store.routing, metrics),
            Finetunes(store.adapters, catalog, settings.finetunes, AdapterUnloader(catalog, client, monitor)),
            owns_store,
            owns_client,
        )

    def start(self, drain: Drain | None = None) -> None:
        """Start the background loops; `drain`: the app's graceful drain, which waits for batch items too."""
        self.monitor.start()
        self.batch_worker = BatchWorker(self.store.queue, self.store.tenancy, self.catalog, self.auth, self.generator,
                                        self.embedder, self.client, self.settings.batch, self.metrics, drain)
        self.batch_worker.start()
        self._tasks.append(asyncio.create_task(queue_upkeep(self.store.queue, self.metrics), name="batch-upkeep"))
        self.kv_streams.start()
        probing = self.monitor.cached_reports.probe_all(self.client, self.catalog, self.settings.fleet.health_interval_s)
        self._tasks.append(asyncio.create_task(probing, name="cached-tokens-probe"))
        self._tasks.append(asyncio.create_task(self.warm_tokenizers(), name="warm-tokenizers"))
        spool = self.generator.metering.spool
        if spool is not None:  # replays records spooled while the ledger was down, now and periodically
            interval = self.settings.billing.ledger_spool_replay_interval_s
            self._tasks.append(asyncio.create_task(replay_forever(spool, self.store.ledger, interval), name="ledger-replay"))
        for loop in self.store.background:  # a region's ledger shipping and budget leases
            self._tasks.append(asyncio.create_task(loop(), name=f"store-{loop.__qualname__}"))
        s = self.settings.store
        if s.redis_url and s.ledger_archive_path:  # bounds the ledger's memory in Redis
            archiving = archive_forever(self.store.ledger, s.ledger_retention_s, s.ledger_archive_interval_s)
            self._tasks.append(asyncio.create_task(archiving, name="ledger-archive"))

    async def warm_tokenizers(self) -> None:
        """Fetch every model's tokenizer now rather than on its first request (best effort)."""
        for model in self.catalog.models:
            if model.task == EMBEDDING_TASK:  # encoded by its backend: the gateway never tokenizes it
                continue
            try:
                await self.generator.tokenizer(model)
            except GatewayError as exc:
                log.info("tokenizer not loaded yet; the first request will retry", model=model.id, reason=exc.message)
            except Exception:  # a broken tokenizer config: say so now, the requests will say it again
                log.exception("loading the tokenizer failed", model=model.id)

    async def aclose(self) -> None:
        if self.batch_worker is not None:  # its items given back while the store and client are open
            await self.batch_worker.aclose()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.monitor.stop()
        await self.kv_streams.stop()
        self.offload.close()
        if self.owns_client:
            await self.client.aclose()
        await self.generator.admitter.aclose()  # admits of callers that left, given back before the store closes
        if self.owns_store:
            await self.store.aclose()
