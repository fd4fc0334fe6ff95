"""One region of a global deployment: this region's own store, the home region's tenancy read from a
local replica, budgets leased from home, the ledger shipped home (README, "Deploying in several regions").

    tenancy.py    ReplicatedTenancy: reads from this region's Redis replica of home's tenancy, writes at home
    leases.py     BudgetLeases: shares of monthly budgets leased from home and renewed in the background
    admission.py  LeasedAdmission: the regional admission, budgets checked against this region's leases
    ledger.py     HomeLedger: records appended in the region, read (exports, dashboard) at home
    shipper.py    LedgerShipper: the regional ledger stream carried home by a consumer group, once each

State moves between regions only through Redis itself: replication for tenancy (`REPLICAOF`), a
stream and its consumer group for the ledger, one script at home for leases; nothing on a request's
path leaves the region in the steady state (the calls of `gateway.store` all go to the regional
Redis or the tenancy replica). The shipping and lease loops are `Store.background`, which the
app's lifespan runs.
"""

from __future__ import annotations

from typing import Any

from gateway.store.factory import Store
from gateway.store.lease import default_replica_id
from gateway.store.ledger import Savings
from gateway.store.redis import redis_store
from gateway.store.redis.adapters import RedisAdapters
from gateway.store.redis.connection import RedisConnection
from gateway.store.redis.ledger import RedisLedger
from gateway.store.regional.admission import LeasedAdmission
from gateway.store.regional.leases import BudgetLeases
from gateway.store.regional.ledger import HomeLedger
from gateway.store.regional.shipper import LedgerShipper
from gateway.store.regional.tenancy import ReplicatedTenancy
from gateway.store.settings import StoreSettings


def open_regional(settings: StoreSettings, savings: Savings) -> Store:
    """This region's store (`settings.redis_url`) joined to the home region (`home_redis_url`);
    connected on first use, like the Redis store."""
    region = settings.region_name
    assert settings.home_redis_url is not None and region is not None, "region_name: set by GatewaySettings"
    settings = settings.model_copy(update={"replica_id": settings.replica_id or default_replica_id()})
    regional_connection = RedisConnection(settings)
    regional = redis_store(regional_connection, savings)
    is_home = settings.redis_url == settings.home_redis_url  # the home region's own store is the record
    home = RedisConnection(settings.model_copy(update={"redis_url": settings.home_redis_url}))
    tenancy_home_url = settings.home_tenancy_url or settings.home_redis_url
    tenancy_home = RedisConnection(settings.model_copy(update={"redis_url": tenancy_home_url}))
    replica = RedisConnection(settings.model_copy(update={"redis_url": settings.tenancy_replica_url or tenancy_home_url}))
    leases = BudgetLeases(regional_connection, home, region, settings.budget_lease_fraction,
                          settings.budget_lease_interval_s)
    home_ledger = RedisLedger(home, savings)
    tenancy = ReplicatedTenancy(replica, tenancy_home)
    background = [leases.run]
    shipper = None if is_home else LedgerShipper(regional_connection, home, home_ledger, settings.ledger_ship_batch)
    if shipper is not None:
        background.append(shipper.run)

    async def health() -> dict[str, Any]:
        return {"region": region, "tenancy_replica": await tenancy.replica_link(),
                "ledger_unshipped": None if shipper is None else await shipper.unshipped()}

    async def close() -> None:
        await regional.aclose()
        await home_ledger.aclose()
        for connection in (home, tenancy_home, replica):
            await connection.aclose()

    return Store(
        tenancy,
        LeasedAdmission(regional.admission, leases),
        regional.routing,
        regional.ledger if is_home else HomeLedger(regional.ledger, home_ledger),
        regional.cache,  # answers are cached per region: a hit never needs home
        regional.queue,  # a batch is queued, run and polled in its region (its records shipped home as any)
        close,
        background=tuple(background),
        health=health,
        # finetunes are the tenant's, kept with its tenancy at home: a request naming one reads it there
        adapters=RedisAdapters(tenancy_home),
    )
