"""The Redis store's ledger: a stream of usage records, time indexes, and bounded retention.

Layout (`redis_codec`): stream entries (request_id, record JSON); time indexes whose members
"{ended_us:016d}:{request_id}\\0{stream id}" order records by (end time, request id) and point at
their entry; the idempotency key `ledger_req:{request_id}` (the entry's id), which expires after
`ledger_idempotency_ttl_s`, longer than any retry (spool replays, crash recovery). One script
appends: a record whose key is still there, or whose member the index still holds, is a
duplicate, so a request is in Redis at most once.

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
than an object store: no new dependency, the export reads it like the embedded store, and one
shared volume serves every replica on a host; run the archiving replica next to it.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from gateway.store import redis_scripts
from gateway.store.archive import LedgerArchive
from gateway.store.checks import check_id
from gateway.store.errors import InvalidArgument
from gateway.store.models import UsageRecord, to_us
from gateway.store.redis_codec import KeyNames, ledger_member, parse_member
from gateway.store.settings import StoreSettings

_PAGE = 500
_LOCK_MS = 120_000  # an archiver that died mid-pass lets the next one in after this
Row = tuple[str, str | None, UsageRecord | None]  # index member, stream id, record (None: gone from the stream)


class RedisLedger:
    def __init__(self, redis: Any, names: KeyNames, settings: StoreSettings, replica: str) -> None:
        """`redis`: the store's client (decoded replies); the archive is opened when configured."""
        self._redis = redis
        self._names = names
        self._replica = replica
        self._ttl_ms = round(settings.ledger_idempotency_ttl_s * 1000)
        self.archive = LedgerArchive(settings.ledger_archive_path) if settings.ledger_archive_path else None
        self._scripts = {
            name: redis.register_script(getattr(redis_scripts, name))
            for name in ("APPEND_USAGE", "TRIM_LEDGER", "RELEASE_LOCK")
        }

    async def append(self, record: UsageRecord) -> bool:
        n = self._names
        written = await self._scripts["APPEND_USAGE"](
            keys=[n.ledger_request(record.request_id), n.ledger(), n.ledger_by_time(), n.ledger_by_time(record.tenant_id)],
            args=[ledger_member(record.ended_us, record.request_id), record.request_id, record.to_json(), self._ttl_ms],
        )
        return bool(written == 1)

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

    async def iter_usage(self, start: float, end: float, tenant_id: str | None) -> AsyncIterator[UsageRecord]:
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
        if self.archive is not None and (owner is None or owner == self.archive.id):
            return self.archive
        if watermark is not None and to_us(start) < int(watermark):
            moved = datetime.fromtimestamp(int(watermark) / 1e6, UTC).isoformat()
            raise InvalidArgument(
                f"records that ended before {moved} were moved to the ledger archive, which this gateway does "
                "not have: read this range where ledger_archive_path is set, or export the archive file itself"
            )
        return None

    async def get_usage(self, request_id: str) -> UsageRecord | None:
        """Within the idempotency key's lifetime from Redis, later from the archive (if configured)."""
        stream_id = await self._redis.get(self._names.ledger_request(request_id))
        if stream_id:
            entries = await self._redis.xrange(self._names.ledger(), stream_id, stream_id, count=1)
            if entries:
                return UsageRecord.from_json(entries[0][1]["record"])
        return await self.archive.get_usage(request_id) if self.archive is not None else None

    # --- retention ---

    async def archive_before(self, older_than: float) -> int:
        """Move the records that ended before `older_than` to the archive; how many were moved.

        0 without an archive, while another replica archives, or when the ledger belongs to another
        archive file. Each batch is committed to the archive before Redis forgets it.
        """
        if self.archive is None:
            return 0
        n = self._names
        await self._redis.set(n.ledger_archive("archive_id"), self.archive.id, nx=True)
        if await self._redis.get(n.ledger_archive("archive_id")) != self.archive.id:
            raise InvalidArgument(
                f"this ledger is archived to another file than {self.archive.path}: set the same "
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
                await self.archive.insert([record for _, _, record in rows if record is not None])
                await self._trim(rows)
                moved += sum(record is not None for _, _, record in rows)
            return moved
        finally:
            await self._scripts["RELEASE_LOCK"](keys=[lock], args=[self._replica])

    async def _trim(self, rows: list[Row]) -> None:
        n = self._names
        keys = [n.ledger(), n.ledger_by_time(), n.ledger_archive("archived_before")]
        args: list[str | int] = [max(parse_member(member)[0] for member, _, _ in rows) + 1]
        for member, stream_id, record in rows:
            keys.append(n.ledger_by_time(record.tenant_id) if record is not None else n.ledger_by_time())
            args += [member, stream_id or ""]
        await self._scripts["TRIM_LEDGER"](keys=keys, args=args)

    async def aclose(self) -> None:
        if self.archive is not None:
            await self.archive.aclose()


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
