"""A backend's side of KV transfer: exporting pinned blocks and importing them, with its metrics.

Built by the app's lifespan once the built-in engine has started (`KVService.start`), stopped at
shutdown. Backends that run context steps (roles prefill and mixed) serve pulls on `kv_port`
(tcp.py's exporter, also the control point of the Mooncake transport) and expire pins no decode
backend pulled within `kv_pin_ttl_s`; backends that run generation steps (decode and mixed) pull.
The expiry loop is an asyncio task owned here, cancelled at stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from backends.kv_transfer.channel import KVChannel, build_channel
from backends.kv_transfer.errors import FingerprintMismatch
from backends.kv_transfer.exports import KVExports
from backends.kv_transfer.layout import KVLayout
from backends.kv_transfer.opaque import OpaqueState
from backends.kv_transfer.tcp import TcpExporter
from backends.server.metrics import BackendMetrics
from backends.settings import BackendSettings
from engines.base import KVPin
from engines.builtin.engine.async_engine import AsyncEngine
from engines.builtin.engine.kv_handoff import ImportPlan

log = logging.getLogger("edgerun.backend.kv")


class KVService:
    def __init__(self, settings: BackendSettings, engine: AsyncEngine, metrics: BackendMetrics) -> None:
        self.settings = settings
        self.engine = engine
        self.metrics = metrics
        self.layout = KVLayout.of(engine.engine.runner.kv_caches, engine.model_name)
        secret = settings.api_key.get_secret_value().encode() if settings.api_key is not None else b""
        self.exports = KVExports(settings.kv_pin_ttl_s, self._release)
        self.exporter: TcpExporter | None = None
        if settings.role != "decode":
            self.exporter = TcpExporter(self.layout, self.exports, secret, settings.host, settings.kv_port)
        self.channel: KVChannel = build_channel(settings.kv_transport, self.layout, secret, self.advertise_host)
        self._expiry: asyncio.Task[None] | None = None

    @property
    def advertise_host(self) -> str:
        """The host decode backends reach this one at (EDGERUN_KV_ADVERTISE_HOST, else the bind address)."""
        host = self.settings.kv_advertise_host or self.settings.host
        return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host

    async def start(self) -> None:
        if self.exporter is not None:
            await self.exporter.start()
            self._expiry = asyncio.create_task(self._expire_loop(), name="edgerun-kv-expiry")
            log.info("KV exporter on %s:%d (%s)", self.advertise_host, self.exporter.port, self.channel.name)

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        if self.exporter is not None:
            await self.exporter.stop()
        with contextlib.suppress(Exception):
            await self.exports.release_all()
        self.channel.close()

    # ---- context side ----------------------------------------------------------------------

    def export(self, pin: KVPin) -> OpaqueState:
        """Register a context step's pin for pulling; returns what the decode side needs."""
        assert self.exporter is not None, "a decode-only backend runs no context steps"
        self.exports.add(pin)
        return OpaqueState(
            transport=self.channel.name,
            host=self.advertise_host,
            port=self.exporter.port,
            pin_id=pin.pin_id,
            num_tokens=pin.num_tokens,
            num_blocks=len(pin.block_ids),
            fingerprint=self.layout.fingerprint,
            extra=self.channel.opaque_extra(pin.block_ids),
        )

    async def _release(self, pin_id: int) -> None:
        await self.engine.call(lambda engine: engine.pins.release(pin_id))

    async def _expire_loop(self) -> None:
        interval = max(0.05, min(1.0, self.settings.kv_pin_ttl_s / 4))
        while True:
            await asyncio.sleep(interval)
            try:
                expired = await self.exports.expire()
            except Exception:
                log.exception("releasing expired KV pins failed")
                continue
            if expired:
                self.metrics.kv_pins_expired.inc(expired)
                log.warning("released %d KV pins no decode backend pulled within %gs", expired, self.exports.ttl_s)

    # ---- generation side -------------------------------------------------------------------

    def check(self, source: OpaqueState, num_prompt_tokens: int) -> None:
        """Refuse a source we must not import from, before any block is reserved or written."""
        if source.fingerprint != self.layout.fingerprint:
            raise FingerprintMismatch(
                "the context backend's KV cache differs from this one (model, block size, dtype or layout): "
                "pair prefill and decode backends that serve the same model with the same settings"
            )
        if source.num_tokens != num_prompt_tokens:
            raise FingerprintMismatch(
                f"the KV state covers {source.num_tokens} tokens but the prompt has {num_prompt_tokens}: "
                "send the context step's prompt_token_ids as the prompt"
            )

    async def fill(self, source: OpaqueState, plan: ImportPlan) -> None:
        """Pull the blocks the plan needs (those past our own prefix hits) into place."""
        started = time.perf_counter()
        try:
            nbytes = await self.channel.pull(source, plan.first_block, plan.block_ids)
        except Exception:
            self.metrics.kv_pulls.labels(self.channel.name, "error").inc()
            raise
        elapsed = time.perf_counter() - started
        self.metrics.kv_pulls.labels(self.channel.name, "ok").inc()
        self.metrics.kv_pull_seconds.labels(self.channel.name).observe(elapsed)
        self.metrics.kv_pull_bytes.labels(self.channel.name).inc(nbytes)
        log.debug("pulled %d blocks (%d bytes) in %.1f ms", len(plan.block_ids), nbytes, elapsed * 1e3)
