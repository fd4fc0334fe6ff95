"""`RedisLedger`: a stream of usage records, time indexes, hourly sums, and bounded retention.

Layout (`keys.py`): stream entries (request_id, record JSON); time indexes whose members
"{ended_us:016d}:{request_id}\\0{stream id}" order records by (end time, request id) and point at
their entry; the idempotency key `ledger_req:{request_id}` (the entry's id), which expires after
`ledger_idempotency_ttl_s`, longer than any retry (spool replays, crash recovery). One script
appends (on its own, or at the end of a request's `settle`): a record whose key is still there, or
whose member the index still holds, is a duplicate, so a request is in Redis at most once.

Hourly sums. The same script adds each record to its hour's sums: a hash per tenant and hour of
the six sums per group (`{group}\x1e{i}`), a hash of the hour's latency values by microsecond
(`t{µs}`, `i{µs}`), and the index `usage_hours` ("{hour}:{tenant}" by hour). They are never
archived (a few fields per tenant, hour and group). A ledger that held records before the sums
existed has them from `usage_hours_since` on (set by the first gateway that keeps them, to the next
whole hour): `hours` says so, and the dashboard reads the earlier hours record by record.

Retention. Redis keeps the ledger in memory, so it must not grow for ever. With
`ledger_archive_path` set, `archive(older_than)` moves the records that ended before
`older_than` into the archive (`archive.LedgerArchive`: a SQLite file, each batch committed with
synchronous=FULL) and only then deletes them from Redis and raises the watermark
`ledger_archived_before`. Money is never lost: a crash between the two steps leaves a record in
both places, and reads merge the two, keeping one copy per request id. Idempotency keys stay
until they expire (so a late retry is still refused), then a retried record would land in Redis
again and be read once all the same (and archived once: the archive is keyed by request id). One archive per ledger:
the first to move records claims the ledger (`ledger_archive_id`); a replica with another file
does not archive, and a replica without the archive refuses to read a range that starts before
the watermark (it would return a bill with holes). Without an archive nothing is deleted, and
Redis must be sized for the whole ledger (SECURITY.md, "Shared store"). A local SQLite file rather
than an object store: no new dependency, the export reads it like the local store, and one
shared volume serves every replica on a host; run the archiving replica next to it.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from redis.exceptions import RedisError

from gateway.store.checks import check_id
from gateway.store.errors import InvalidArgument
from gateway.store.ledger import (
    HOUR_S,
    HourUsage,
    Savings,
    SummedHours,
    UsageGroup,
    UsageSums,
    hour_of,
    savings_or_zero,
    to_latency_us,
)
from gateway.store.models import UsageRecord, to_us
from gateway.store.redis.archive import LedgerArchive
from gateway.store.redis.connection import RedisConnection, redis_errors, store_error
from gateway.store.redis.keys import ledger_member, parse_member

_PAGE = 500
_GROUP_SEP, _SUM_SEP = "\x1f", "\x1e"
_SUM_FIELDS = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "cost_micro", "savings_micro")
_LOCK_MS = 120_000  # an archiver that died mid-pass lets the next one in after this
Row = tuple[str, str | None, UsageRecord | None]  # index member, stream id, record (None: gone from the stream)


class RedisLedger:
    def __init__(self, connection: RedisConnection, savings: Savings) -> None:
        """The archive is opened when configured (`ledger_archive_path`)."""
        settings = connection.settings
        self._c = connection
        self._redis: Any = connection.redis
        self._names = connection.names
        self._replica = connection.replica
        self._savings = savings_or_zero(savings)
        self._ttl_ms = round(settings.ledger_idempotency_ttl_s * 1000)
        self.archive_file = LedgerArchive(settings.ledger_archive_path) if settings.ledger_archive_path else None
        self._since: int | None = None  # `usage_hours_since`, once known

    async def sums_ready(self) -> None:
        """Make sure the hourly sums' start is known before records are appended other than by
        `append` (a region's shipper appends them in pipelines of the same script)."""
        await self._sums_since()

    async def _sums_since(self) -> int:
        """The first hour whose sums are complete (see the module's doc); set by the first gateway to ask."""
        if self._since is None:
            key = self._names.usage_hours_since()
            await self._redis.set(key, hour_of(time.time()) + HOUR_S, nx=True)
            self._since = int(await self._redis.get(key))
        return self._since

    def record_args(self, record: UsageRecord) -> tuple[list[str], list[Any]]:
        """The keys and arguments of the script function `append_usage` (scripts.py) for `record`."""
        n = self._names
        hour = hour_of(record.ended_at)
        group = _GROUP_SEP.join((record.model, record.backend_id or "", record.region or "", record.status,
                                 record.price_version))
        keys = [n.ledger_request(record.request_id), n.ledger(), n.ledger_by_time(), n.ledger_by_time(record.tenant_id),
                n.usage_hour("sums", record.tenant_id, hour), n.usage_hour("latency", record.tenant_id, hour),
                n.usage_hours()]
        args: list[Any] = [
            ledger_member(record.ended_us, record.request_id), record.request_id, record.to_json(), self._ttl_ms,
            group, record.prompt_tokens, record.cached_tokens, record.completion_tokens, record.cost_micro,
            self._savings(record), f"{hour}:{record.tenant_id}", hour,
            "" if record.ttft_s is None else to_latency_us(record.ttft_s),
            "" if record.itl_s is None else to_latency_us(record.itl_s),
        ]
        return keys, args

    @redis_errors
    async def append(self, record: UsageRecord) -> bool:
        if not isinstance(record, UsageRecord):
            raise TypeError(f"append takes a UsageRecord, got {type(record).__name__}")
        await self._sums_since()
        keys, args = self.record_args(record)
        return bool(await self._c.script("APPEND_USAGE")(keys=keys, args=args) == 1)

    # --- reading ---

    async def _rows(self, members: list[str]) -> list[Row]:
        parsed = [parse_member(m) for m in members]
        unknown = [request_id for _, request_id, stream_id in parsed if stream_id is None]
        looked_up = iter(await self._redis.mget([self._names.ledger_request(r) for r in unknown]) if unknown else [])
        stream_ids = [stream_id if stream_id is not None else next(looked_up) for _, _, stream_id in parsed]
        async with self._redis.pipeline(transaction=False) as pipe:
            for stream_id in stream_ids:
                pipe.xrange(self._names.ledger(), stream_id or "-", stream_id or "-", count=1)
            entries = await pipe.execute()
        return [
            (member, stream_id, UsageRecord.from_json(entry[0][1]["record"]) if stream_id and entry else None)
            for member, stream_id, entry in zip(members, stream_ids, entries)
        ]

    async def _iter_redis(self, start: float, end: float, tenant_id: str | None) -> AsyncIterator[UsageRecord]:
        index = self._names.ledger_by_time(tenant_id)
        low, high = "[" + ledger_member(to_us(start), ""), "(" + ledger_member(to_us(end), "")
        while True:
            members = await self._redis.zrangebylex(index, low, high, start=0, num=_PAGE)
            for _, _, record in await self._rows(members) if members else []:
                if record is not None:  # gone from the stream: archived a moment ago
                    yield record
            if len(members) < _PAGE:
                return
            low = "(" + members[-1]

    async def iter_usage(self, start: float, end: float, tenant_id: str | None = None) -> AsyncIterator[UsageRecord]:
        try:
            async for record in self._iter_usage(start, end, tenant_id):
                yield record
        except RedisError as exc:
            converted = store_error(exc)
            if converted is None:
                raise
            raise converted from exc

    async def _iter_usage(self, start: float, end: float, tenant_id: str | None) -> AsyncIterator[UsageRecord]:
        if tenant_id is not None:
            check_id("tenant id", tenant_id)
        archive = await self._readable_archive(start)
        hot = self._iter_redis(start, end, tenant_id)
        if archive is None:
            async for record in hot:
                yield record
            return
        last: str | None = None
        async for record in _merge(hot, archive.iter_usage(start, end, tenant_id)):
            if record.request_id != last:  # in both places between archiving and trimming
                yield record
            last = record.request_id

    async def _readable_archive(self, start: float) -> LedgerArchive | None:
        """The archive to merge (None if there is nothing archived to read); raises when records
        from `start` on were archived to a file this replica does not have."""
        n = self._names
        watermark, owner = await self._redis.mget([n.ledger_archive("archived_before"), n.ledger_archive("archive_id")])
        if self.archive_file is not None and (owner is None or owner == self.archive_file.id):
            return self.archive_file
        if watermark is not None and to_us(start) < int(watermark):
            moved = datetime.fromtimestamp(int(watermark) / 1e6, UTC).isoformat()
            raise InvalidArgument(
                f"records that ended before {moved} were moved to the ledger archive, which this gateway does "
                "not have: read this range where ledger_archive_path is set, or export the archive file itself"
            )
        return None

    @redis_errors
    async def get(self, request_id: str) -> UsageRecord | None:
        """Within the idempotency key's lifetime from Redis, later from the archive (if configured)."""
        stream_id = await self._redis.get(self._names.ledger_request(request_id))
        if stream_id:
            entries = await self._redis.xrange(self._names.ledger(), stream_id, stream_id, count=1)
            if entries:
                return UsageRecord.from_json(entries[0][1]["record"])
        return await self.archive_file.get_usage(request_id) if self.archive_file is not None else None

    # --- retention ---

    @redis_errors
    async def archive(self, older_than: float) -> int:
        """Move the records that ended before `older_than` to the archive; how many were moved.

        0 without an archive, while another replica archives, or when the ledger belongs to another
        archive file. Each batch is committed to the archive before Redis forgets it.
        """
        if self.archive_file is None:
            return 0
        n = self._names
        await self._redis.set(n.ledger_archive("archive_id"), self.archive_file.id, nx=True)
        if await self._redis.get(n.ledger_archive("archive_id")) != self.archive_file.id:
            raise InvalidArgument(
                f"this ledger is archived to another file than {self.archive_file.path}: set the same "
                "ledger_archive_path (a shared volume) on every archiving replica, or on one replica only"
            )
        lock = n.ledger_archive("archive_lock")
        if not await self._redis.set(lock, self._replica, nx=True, px=_LOCK_MS):
            return 0
        try:
            moved = 0
            high = "(" + ledger_member(to_us(older_than), "")
            while members := await self._redis.zrangebylex(n.ledger_by_time(), "-", high, start=0, num=_PAGE):
                rows = await self._rows(members)
                moving = [record for _, _, record in rows if record is not None]
                await self.archive_file.insert(moving, [self._savings(record) for record in moving])
                await self._trim(rows)
                moved += sum(record is not None for _, _, record in rows)
            return moved
        finally:
            await self._c.script("RELEASE_LOCK")(keys=[lock], args=[self._replica])

    async def _trim(self, rows: list[Row]) -> None:
        n = self._names
        keys = [n.ledger(), n.ledger_by_time(), n.ledger_archive("archived_before")]
        args: list[str | int] = [max(parse_member(member)[0] for member, _, _ in rows) + 1]
        for member, stream_id, record in rows:
            keys.append(n.ledger_by_time(record.tenant_id) if record is not None else n.ledger_by_time())
            args += [member, stream_id or ""]
        await self._c.script("TRIM_LEDGER")(keys=keys, args=args)

    # --- hourly sums ---

    @redis_errors
    async def hours(self, start_hour: int, end_hour: int, tenant_id: str | None = None) -> SummedHours:
        if tenant_id is not None:
            check_id("tenant id", tenant_id)
        since = await self._sums_since()
        members = await self._redis.zrangebyscore(self._names.usage_hours(), max(start_hour, since), end_hour - 1)
        found = [(int(hour), tenant) for hour, _, tenant in (m.partition(":") for m in members)
                 if tenant_id is None or tenant == tenant_id]
        n = self._names
        async with self._redis.pipeline(transaction=False) as pipe:
            for hour, tenant in found:
                pipe.hgetall(n.usage_hour("sums", tenant, hour))
                pipe.hgetall(n.usage_hour("latency", tenant, hour))
            rows = await pipe.execute()
        hours: dict[int, HourUsage] = {}
        for i, (hour, tenant) in enumerate(found):
            usage = hours.setdefault(hour, HourUsage(hour))
            for field, value in rows[2 * i].items():
                group_text, _, index = field.rpartition(_SUM_SEP)
                model, backend, region, status, version = group_text.split(_GROUP_SEP)
                sums = usage.groups.setdefault(UsageGroup(tenant, model, backend or None, region or None, status, version),
                                               UsageSums())
                name = _SUM_FIELDS[int(index)]
                setattr(sums, name, getattr(sums, name) + int(value))
            for field, count in rows[2 * i + 1].items():
                counter: Counter[int] = usage.ttft_us if field[0] == "t" else usage.itl_us
                counter[int(field[1:])] += int(count)
        return SummedHours(since, [hours[h] for h in sorted(hours)])

    async def aclose(self) -> None:
        if self.archive_file is not None:
            await self.archive_file.aclose()


async def _merge(a: AsyncIterator[UsageRecord], b: AsyncIterator[UsageRecord]) -> AsyncIterator[UsageRecord]:
    """Two iterators sorted by (ended_us, request_id), merged in that order."""
    heads: list[tuple[tuple[int, str], int, UsageRecord]] = []
    sources = (a, b)
    for i, source in enumerate(sources):
        first = await anext(source, None)
        if first is not None:
            heapq.heappush(heads, ((first.ended_us, first.request_id), i, first))
    while heads:
        _, i, record = heapq.heappop(heads)
        yield record
        following = await anext(sources[i], None)
        if following is not None:
            heapq.heappush(heads, ((following.ended_us, following.request_id), i, following))
