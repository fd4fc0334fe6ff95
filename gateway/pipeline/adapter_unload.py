"""A deleted finetune's adapter, unloaded from every backend of its base model.

The gateway calls a finetune on a backend by its id (finetunes.py), so a new finetune, even of the same
name, is always a new adapter there and never meets a deleted one's weights. Unloading frees what the
deleted one held: a vLLM's registered adapter and its place in vLLM's LoRA caches, a built-in backend's
resident slot (`POST /v1/unload_lora_adapter`, which both speak). Every backend of the model is told, not
only those this gateway loaded it on: another replica may have loaded it, and a built-in backend loads
adapters itself. They are told at once, each within `timeout_s`.

A backend that cannot be told (down, too slow, refusing) does not fail the delete: it is logged, and
that backend keeps the adapter until its own LRU evicts it (built-in: the next load that needs its slot;
vLLM: its CPU cache of `--max-cpu-loras`) or it restarts. No request reaches it meanwhile: the gateway
refuses the deleted finetune's name and id (404) before routing, and its files are gone.
"""

from __future__ import annotations

import asyncio

import structlog

from backends.client import BackendClient, BackendError, Endpoint
from gateway.fleet.catalog import Catalog
from gateway.fleet.monitor import BackendMonitor

log = structlog.get_logger("edgerun.gateway.adapter_unload")

UNLOAD_TIMEOUT_S = 10.0


class AdapterUnloader:
    def __init__(self, catalog: Catalog, client: BackendClient, monitor: BackendMonitor,
                 timeout_s: float = UNLOAD_TIMEOUT_S) -> None:
        self.catalog = catalog
        self.client = client
        self.monitor = monitor
        self.timeout_s = timeout_s

    async def unload(self, model_id: str, adapter: str) -> list[str]:
        """Unload `adapter` from every backend of `model_id` -> the ids of those that could not be told."""
        endpoints = self.catalog.endpoints(model_id)
        results = await asyncio.gather(*(self._unload_one(e, adapter) for e in endpoints))
        return [endpoint.id for endpoint, ok in zip(endpoints, results) if not ok]

    async def _unload_one(self, endpoint: Endpoint, adapter: str) -> bool:
        self.monitor.forget_adapter(endpoint.id, adapter)
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.client.unload_adapter(endpoint, adapter)
        except (BackendError, TimeoutError) as exc:
            log.warning("adapter_unload_failed", adapter=adapter, backend=endpoint.id, error=str(exc),
                        outcome="kept there until that backend evicts it or restarts")
            return False
        return True
