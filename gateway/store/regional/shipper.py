"""`LedgerShipper`: carries the region's ledger records to the home region, each exactly once.

The regional ledger is a Redis stream (`{p}ledger`, redis/ledger.py) that every request's `settle`
appends to. The shipper reads it as a Redis consumer group (`XREADGROUP`; one consumer per gateway
replica, named by its replica id), appends each batch at home in one round trip (a pipeline of the
home ledger's own append script, which keeps one record per request id), and only then
acknowledges it (`XACK`). So a record leaves the region's pending list only once home holds it:

- a batch is one round trip home (a pipeline of EVALSHA; the script is loaded when home says it
  has not got it), so a record is home about one WAN round trip after its request ended;
- the link down (or home): the batch stays pending; the shipper retries it, then reads on; the
  region keeps serving and its records queue in its stream (bounded by its memory: size the regional
  Redis for the longest outage, and keep `ledger_retention_s` longer than it if the region archives);
- a crash or a lost reply after home appended: the batch is shipped again and home keeps the copy
  it has (the idempotency key lives `ledger_idempotency_ttl_s`), so a record is never doubled;
- a replica that stopped: its pending records are claimed by another replica (`XAUTOCLAIM`) after
  `_CLAIM_IDLE_MS`;
- the regional Redis restarted: the group is created again (from the stream's start; records home
  has already are kept once), which needs the regional Redis to persist (appendonly) to lose nothing.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from redis.exceptions import NoScriptError, RedisError, ResponseError

from gateway.store.models import UsageRecord
from gateway.store.redis.connection import RedisConnection
from gateway.store.redis.ledger import RedisLedger

log = structlog.get_logger("edgerun.gateway.store.regional")

GROUP = "edgerun-ship"
_BLOCK_MS = 500  # under the connection's socket timeout (redis_timeout_s)
_CLAIM_IDLE_MS = 30_000
_RETRY_S = (0.1, 0.25, 0.5, 1.0)
Entry = tuple[str, dict[str, str] | None]


class LedgerShipper:
    def __init__(self, regional: RedisConnection, home_connection: RedisConnection, home: RedisLedger,
                 batch: int) -> None:  # fmt: skip
        self._regional: Any = regional.redis
        self._stream = regional.names.ledger()
        self._consumer = regional.replica
        self._home_connection = home_connection
        self._home = home
        self._batch = batch
        self._append: Any = home_connection.script("APPEND_USAGE")
        self._group_ready = False
        self.shipped = 0  # records acknowledged (shipped, or home had them already)

    async def run(self) -> None:
        """Ship until cancelled: this replica's pending records first, then new ones as they come."""
        failures = 0
        pending = True  # a restart starts with what this consumer read and did not acknowledge
        claimed_at = time.monotonic()
        while True:
            try:
                await self._ensure_group()
                if time.monotonic() - claimed_at > _CLAIM_IDLE_MS / 1000:  # now and then: what stopped replicas left
                    pending, claimed_at = True, time.monotonic()
                entries = await self._read(pending)
                if entries:
                    await self.ship(entries)
                pending = len(entries) == self._batch if pending else False
                failures = 0
            except (RedisError, OSError) as exc:
                if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
                    self._group_ready = False  # the regional Redis lost its data
                pending = True
                delay = _RETRY_S[min(failures, len(_RETRY_S) - 1)]
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log.warning("shipping the ledger home failed; retrying", reason=str(exc), failures=failures)
                await asyncio.sleep(delay)

    async def unshipped(self) -> int | None:
        """Records in the regional stream not yet acknowledged home (None: not known yet)."""
        try:
            groups = await self._regional.xinfo_groups(self._stream)
        except (RedisError, OSError):
            return None
        for group in groups:
            if group.get("name") == GROUP:
                return int(group.get("lag") or 0) + int(group.get("pending") or 0)
        return None

    async def _ensure_group(self) -> None:
        if self._group_ready:
            return
        try:
            await self._regional.xgroup_create(self._stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    async def _read(self, pending: bool) -> list[Entry]:
        if pending:  # what this consumer was given and has not acknowledged, then what a stopped one left
            mine = await self._regional.xreadgroup(GROUP, self._consumer, {self._stream: "0"}, count=self._batch)
            entries = mine[0][1] if mine else []
            if entries:
                return list(entries)
            claimed = await self._regional.xautoclaim(
                self._stream, GROUP, self._consumer, _CLAIM_IDLE_MS, "0-0", count=self._batch
            )
            if claimed[1]:
                return list(claimed[1])
        found = await self._regional.xreadgroup(
            GROUP, self._consumer, {self._stream: ">"}, count=self._batch, block=_BLOCK_MS
        )
        return list(found[0][1]) if found else []

    async def _append_home(self, records: list[UsageRecord]) -> None:
        """One round trip: EVALSHA of the home ledger's append script per record (no SCRIPT EXISTS first)."""
        async with self._home_connection.redis.pipeline(transaction=False) as pipe:
            for record in records:
                keys, args = self._home.record_args(record)
                pipe.evalsha(self._append.sha, len(keys), *keys, *args)
            await pipe.execute()

    async def ship(self, entries: list[Entry]) -> None:
        """Append the entries' records at home in one round trip, then acknowledge them here."""
        records = [UsageRecord.from_json(fields["record"]) for _, fields in entries if fields and "record" in fields]
        if records:
            await self._home.sums_ready()
            try:
                await self._append_home(records)
            except NoScriptError:  # home restarted since: load the script, then append them all again
                await self._home_connection.redis.script_load(self._append.script)
                await self._append_home(records)
        await self._regional.xack(self._stream, GROUP, *(entry_id for entry_id, _ in entries))
        self.shipped += len(entries)
