"""A backend's side of its region's shared KV pool: fetch before prefilling, share after serving.

`fill(prompt, salt)` runs before a request is submitted: it looks how far the engine's own pool
and host tier reach into the prompt's tenant-salted block chain, asks the region's pool for the
longest run of the next blocks it holds, checks each block's tokens and hands them to the engine's
host tier (engine/host_tier.py), from which allocation copies them into the pool as any host-tier
hit. `share_later(prompt, salt)` runs after a request finished, as a task owned here: the prompt's
full blocks the pool does not hold yet are copied out of the engine and put.

The pool is an optimisation, never a dependency: every call has a timeout, and a failed or late
call (the master down, a segment gone) leaves the pool alone for `kv_region_pool_retry_s` while
the backend serves from its own tiers; the next call after that joins again (the master back:
the pool refills as requests finish). Stored blocks are reported as KV events with medium
REGION, so the gateway's index knows the region holds them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from backends.kv_transfer.layout import KVLayout
from backends.kv_transfer.region_pool import BlockCodec, MooncakePool, PoolUnavailable
from backends.server.metrics import BackendMetrics
from backends.settings import BackendSettings
from contracts.kv_events import MEDIUM_REGION
from contracts.prefix_hash import chain_hashes, salt_root
from engines.base import KVTierCounters
from engines.builtin.engine.async_engine import AsyncEngine
from engines.builtin.engine.host_tier import TierBlock

log = logging.getLogger("edgerun.backend.region_pool")

T = TypeVar("T")
MAX_BATCH_BYTES = 32 << 20  # per get or put call: within the client's transfer buffer
MAX_PENDING_SHARES = 8  # share tasks at once; past it a finished request's blocks are not shared


class RegionPoolService:
    def __init__(self, settings: BackendSettings, engine: AsyncEngine, metrics: BackendMetrics) -> None:
        assert settings.kv_region_pool_master is not None
        self.settings = settings
        self.engine = engine
        self.metrics = metrics
        llm = engine.engine
        tier = llm.block_manager.host_tier
        assert tier is not None, "settings require a host tier with the regional pool"
        caches = llm.runner.kv_caches
        layout = KVLayout.of(caches, engine.model_name)
        self.codec = BlockCodec(layout.fingerprint, (len(caches), *caches[0].shape[1:]), tier.storage_dtype)
        self.block_size = llm.block_manager.block_size
        self.max_fetch_blocks = tier.capacity_blocks
        block_bytes = layout.nbytes(1) * tier.storage_dtype.itemsize // caches[0].element_size()
        self.batch_blocks = max(1, MAX_BATCH_BYTES // block_bytes)
        host = settings.kv_advertise_host or settings.host
        self.pool = MooncakePool(
            settings.kv_region_pool_master, "127.0.0.1" if host in ("0.0.0.0", "::", "") else host,
            settings.kv_region_pool_segment_mb << 20, 2 * MAX_BATCH_BYTES + (16 << 20),
        )
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="edgerun-region-pool")
        self._down_until = 0.0
        self._shares: set[asyncio.Task[None]] = set()
        # what /metrics reports for tier "region": hits and misses of fetches, bytes put (in) and
        # fetched (out), fetch seconds; its evictions are the pool's own (mooncake_master's metrics)
        self.counters = KVTierCounters()
        metrics.region_tier = self.counters

    @property
    def is_up(self) -> bool:
        return time.monotonic() >= self._down_until

    async def start(self) -> None:
        try:
            await self._call(lambda: None)
        except PoolUnavailable as exc:
            log.warning("the region's KV pool is not reachable yet (%s): serving from this backend's tiers", exc)

    async def stop(self) -> None:
        for task in list(self._shares):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(self._executor, self.pool.close), 5)
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ---- before a prefill ------------------------------------------------------------------

    async def fill(self, prompt: list[int], cache_salt: str | None) -> int:
        """Fetch the blocks after this engine's own hits that the pool holds; returns how many.
        Never fails the request: whatever goes wrong, it is prefilled as without the pool."""
        try:
            return await self._fill(prompt, cache_salt)
        except Exception:
            log.exception("fetching from the region's KV pool failed: prefilling instead")
            self.metrics.kv_region_pool_errors.inc()
            return 0

    async def _fill(self, prompt: list[int], cache_salt: str | None) -> int:
        bs = self.block_size
        num_blocks = (len(prompt) - 1) // bs  # the last token is always computed
        if num_blocks == 0 or not self.is_up:
            return 0
        # read from this thread, not the engine's: a hint (a block may move meanwhile), and it costs
        # the request no wait for the step under way
        match = self.engine.engine.block_manager.match(prompt, cache_salt)
        first = match.num_blocks
        hashes = chain_hashes(prompt[: num_blocks * bs], bs, cache_salt)
        keep = [b.hash for b in match.tier_blocks]  # the tier must hold these and the fetched ones at once
        wanted = hashes[first : first + max(0, self.max_fetch_blocks - len(keep))]
        if not wanted:
            return 0
        started = time.perf_counter()
        keys = [self.codec.key(h) for h in wanted]
        try:
            run = await self._call(lambda: self.pool.leading_run(keys))
            values: list[bytes] = []
            for i in range(0, run, self.batch_blocks):
                batch = keys[i : min(run, i + self.batch_blocks)]
                values += await self._call(lambda batch=batch: self.pool.get(batch))  # type: ignore[misc]
        except PoolUnavailable:
            return 0
        blocks = self._verified(prompt, cache_salt, first, hashes, values)
        if blocks:  # runs before the request, which is submitted after it
            self.engine.post(lambda e: e.block_manager.admit_fetched(blocks, keep))
        elapsed = time.perf_counter() - started
        c = self.counters
        c.num_hit_blocks += len(blocks)
        c.num_miss_blocks += len(wanted) - len(blocks)
        c.num_bytes_out += sum(len(v) for v in values[: len(blocks)])
        c.seconds += elapsed
        self.metrics.kv_region_fetch_seconds.observe(elapsed)
        return len(blocks)

    def _verified(
        self, prompt: list[int], cache_salt: str | None, first: int, hashes: list[int], values: list[bytes],
    ) -> list[TierBlock]:
        """The fetched blocks, up to the first whose tokens or parent are not the prompt's."""
        bs = self.block_size
        parent = hashes[first - 1] if first else salt_root(cache_salt)
        blocks = []
        for i, value in enumerate(values):
            index = first + i
            block = self.codec.decode(hashes[index], value)
            if block is None or block.token_ids != tuple(prompt[index * bs : (index + 1) * bs]):
                break
            blocks.append(TierBlock(block.hash, parent, block.token_ids, block.data))
            parent = block.hash
        return blocks

    # ---- after a request -------------------------------------------------------------------

    def share_later(self, prompt: list[int], cache_salt: str | None) -> None:
        """Put the prompt's full blocks into the pool in the background (skipped while it is down)."""
        if not self.is_up or len(self._shares) >= MAX_PENDING_SHARES or len(prompt) <= self.block_size:
            return
        task = asyncio.create_task(self._share(prompt, cache_salt), name="edgerun-region-share")
        self._shares.add(task)
        task.add_done_callback(self._shares.discard)

    async def _share(self, prompt: list[int], cache_salt: str | None) -> None:
        bs = self.block_size
        num_blocks = (len(prompt) - 1) // bs
        hashes = chain_hashes(prompt[: num_blocks * bs], bs, cache_salt)
        keys = [self.codec.key(h) for h in hashes]
        try:
            missing = await self._call(lambda: self.pool.missing(keys))
            wanted = [hashes[i] for i in missing]
            if not wanted:
                return
            dtype = self.codec.dtype
            blocks = await self.engine.call(lambda e: e.block_manager.read_blocks(wanted, e.kv_io, dtype))
            for i in range(0, len(blocks), self.batch_blocks):
                batch = blocks[i : i + self.batch_blocks]
                values = [self.codec.encode(b) for b in batch]
                batch_keys = [self.codec.key(b.hash) for b in batch]
                await self._call(lambda k=batch_keys, v=values: self.pool.put(k, v))  # type: ignore[misc]
                self.counters.num_bytes_in += sum(len(v) for v in values)
                self.counters.num_stored_blocks += len(batch)
                self.engine.engine.kv_events.stored_chain(batch, MEDIUM_REGION)
        except PoolUnavailable:
            return

    # ---- calls on the client's thread ------------------------------------------------------

    async def _call(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the pool's thread (joining the pool first if needed), within the timeout."""
        if not self.is_up:
            raise PoolUnavailable("the region's pool failed recently")
        loop = asyncio.get_running_loop()

        def run() -> T:
            if not self.pool.is_set_up:
                self.pool.setup()
            return fn()

        try:
            return await asyncio.wait_for(loop.run_in_executor(self._executor, run), self.settings.kv_region_pool_timeout_s)
        except (PoolUnavailable, TimeoutError, OSError, RuntimeError) as exc:
            self._down_until = time.monotonic() + self.settings.kv_region_pool_retry_s
            self.metrics.kv_region_pool_errors.inc()
            log.warning("the region's KV pool failed (%s): serving from this backend's tiers for %gs",
                        exc or type(exc).__name__, self.settings.kv_region_pool_retry_s)
            raise PoolUnavailable(str(exc)) from exc
