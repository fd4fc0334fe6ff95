"""The ledger's retention task: moves old usage records out of Redis into the durable archive.

Owned by the app's lifespan when `ledger_archive_path` is set (see `gateway.store.redis.ledger`):
every `ledger_archive_interval_s` it archives the records that ended more than
`ledger_retention_s` ago. Failures are logged and retried next period; nothing is deleted from
Redis before the archive has it.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from gateway.store.ledger import Ledger

log = structlog.get_logger("edgerun.gateway.billing.retention")


async def archive_forever(ledger: Ledger, retention_s: float, interval_s: float) -> None:
    """Archive now (start-up), then every `interval_s`; runs until cancelled."""
    while True:
        try:
            moved = await ledger.archive(time.time() - retention_s)
        except Exception as exc:
            log.warning("archiving the ledger failed; retrying next period", error=str(exc))
        else:
            if moved:
                log.info("ledger records archived", moved=moved)
        await asyncio.sleep(interval_s)
