"""The Redis ledger's bounded retention: idempotency keys expire, old records move to a durable
archive before Redis forgets them, and reads still return every record exactly once."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import redis

from gateway.settings import GatewaySettings
from gateway.store import InvalidArgument, Store, UsageRecord, open_store
from gateway.store.redis.archive import LedgerArchive
from tests.gateway.store.test_ledger import T0, collect, record


def redis_store(redis_url: str, prefix: str, archive: Path | None = None, **overrides: object) -> Store:
    settings = GatewaySettings(
        redis_url=redis_url, key_prefix=prefix, ledger_archive_path=str(archive) if archive else None, **overrides
    )
    return open_store(settings.store)


def records(num: int) -> list[UsageRecord]:
    rng = random.Random(3)
    return [record(f"req-{i:03d}", T0 + rng.uniform(0, 100), tenant_id=rng.choice(["acme", "beta"]))
            for i in range(num)]


async def test_idempotency_keys_expire_and_a_late_duplicate_is_still_refused(redis_url: str, redis_prefix: str) -> None:
    store = redis_store(redis_url, redis_prefix, ledger_retention_s=60, ledger_idempotency_ttl_s=120)
    try:
        first = record("req-1", T0)
        assert await store.ledger.append(first)
        with redis.Redis.from_url(redis_url) as raw:
            key = f"{redis_prefix}ledger_req:req-1"
            assert 0 < raw.pttl(key) <= 120_000
            raw.delete(key)  # as if it expired
        assert not await store.ledger.append(first)  # the time index still holds the request
        assert await collect(store, T0 - 1, T0 + 1) == [first]
    finally:
        await store.aclose()


async def test_old_records_move_to_the_archive_and_every_read_finds_them_once(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    archive = tmp_path / "ledger-archive.sqlite3"
    store = redis_store(redis_url, redis_prefix, archive)
    plain = redis_store(redis_url, redis_prefix)  # a replica without the archive
    everything = records(1200)  # more than two pages
    try:
        for r in everything:
            assert await store.ledger.append(r)
        expected = sorted(everything, key=lambda r: (r.ended_us, r.request_id))
        cutoff = T0 + 60
        old = [r for r in expected if r.ended_at < cutoff]
        # a crash between archiving and trimming leaves records in both places (here some not yet due)
        crashed = LedgerArchive(str(archive))
        moved = old[:50] + expected[len(old):][:50]
        await crashed.insert(moved, [0] * len(moved))
        await crashed.aclose()

        assert await store.ledger.archive(cutoff) == len(old)
        with redis.Redis.from_url(redis_url) as raw:
            assert raw.xlen(f"{redis_prefix}ledger") == len(expected) - len(old)  # Redis forgot them
            assert raw.zcard(f"{redis_prefix}ledger_by_time") == len(expected) - len(old)
            assert raw.pttl(f"{redis_prefix}ledger_req:{old[0].request_id}") > 0  # expires on its own
        assert await collect(store, T0 - 1, T0 + 101) == expected  # merged, in order, once each
        assert await collect(store, T0 - 1, T0 + 101, "beta") == [r for r in expected if r.tenant_id == "beta"]
        assert await store.ledger.get(old[0].request_id) == old[0]
        assert not await store.ledger.append(old[-1])  # its idempotency key outlives its time in Redis

        # without the archive, a range reaching back before the watermark is refused, not returned short
        with pytest.raises(InvalidArgument, match="ledger archive"):
            await collect(plain, T0 - 1, T0 + 101)
        assert await collect(plain, T0 + 61, T0 + 101) == [r for r in expected if r.ended_at >= T0 + 61]
        assert await plain.ledger.archive(T0 + 100) == 0  # nothing to archive to
    finally:
        await store.aclose()
        await plain.aclose()


async def test_one_ledger_one_archive(redis_url: str, redis_prefix: str, tmp_path: Path) -> None:
    first = redis_store(redis_url, redis_prefix, tmp_path / "a.sqlite3")
    other = redis_store(redis_url, redis_prefix, tmp_path / "b.sqlite3")
    try:
        await first.ledger.append(record("req-1", T0))
        assert await first.ledger.archive(T0 + 1) == 1
        await other.ledger.append(record("req-2", T0 + 2))
        with pytest.raises(InvalidArgument, match="another file"):
            await other.ledger.archive(T0 + 3)
        with pytest.raises(InvalidArgument, match="ledger archive"):  # b.sqlite3 is not this ledger's archive
            await collect(other, T0 - 1, T0 + 5)
        assert [r.request_id for r in await collect(first, T0 - 1, T0 + 5)] == ["req-1", "req-2"]
    finally:
        await first.aclose()
        await other.aclose()
