"""`BudgetLeases`: the shares of tenants' monthly budgets this region may spend, leased from home.

The home region keeps, per tenant and month, what it has leased out (`{p}budget_lease:{tenant}:{month}`,
a hash: `total`, and each region's sum), and one script grants a lease only from what is left of the
budget (a part of it when less is left; nothing when nothing is). The region adds each grant to its
own `{p}budget_granted:{tenant}:{month}` in its Redis, beside its spend (`{p}budget:{tenant}:{month}`,
kept by the regional admission as a single region's is), and admits a request only while its spend
plus the request's reservation fits in what it was granted (`LeasedAdmission`).

So no budget is ever overspent: what regions spend is at most what they were granted, and home
never grants more than the budget. (A regional store that loses its data loses its grants with its
spend, and starts again from new leases.) The price is the leases a region holds but has not
spent, which other regions cannot use: at most one and a half leases per region, since a region
takes its next lease once less than half of one is left (`budget_lease_fraction` sets the lease).

The steady state takes no WAN round trip on a request's path: the grants are read from memory
(re-read from the regional Redis every `budget_lease_interval_s`, so the region's replicas agree), and
leases are renewed by the background loop (`run`). A request finds no lease only when the region has
none yet for that tenant and month, or has spent it faster than the loop renewed it: it takes one at
once, a round trip to home; while home is unreachable it is refused as over budget (429), so a region
cut off serves each tenant within the leases it holds.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import structlog
from redis.exceptions import RedisError

from gateway.store.errors import StoreUnavailable
from gateway.store.redis.connection import RedisConnection, redis_errors

log = structlog.get_logger("edgerun.gateway.store.regional")

# KEYS[1]: the lease hash at home; ARGV: region, wanted, budget -> granted now
_GRANT = """
local total = tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
local give = math.min(tonumber(ARGV[2]), tonumber(ARGV[3]) - total)
if give <= 0 then return 0 end
redis.call('HINCRBY', KEYS[1], 'total', give)
redis.call('HINCRBY', KEYS[1], ARGV[1], give)
return give
"""
_HOME_DOWN_S = 2.0  # after a failed call to home, requests do not wait on it again for this long


@dataclass(slots=True)
class Lease:
    budget_micro: int
    granted_micro: int = 0  # what this region was granted so far (as last read or added)
    spent_micro: int = 0  # this region's spend, as the last admit saw it
    home_empty_until: float = 0.0  # home had no budget left a moment ago: not asked again until then

    @property
    def left_micro(self) -> int:
        return self.granted_micro - self.spent_micro


class BudgetLeases:
    def __init__(self, regional: RedisConnection, home: RedisConnection, region: str, fraction: float,
                 interval_s: float) -> None:  # fmt: skip
        self._regional = regional
        self._home = home
        self._region = region
        self._fraction = fraction
        self._interval_s = interval_s
        self._leases: dict[tuple[str, str], Lease] = {}
        self._wake = asyncio.Event()
        self._home_down_until = 0.0
        self._grant = home.redis.register_script(_GRANT)

    def lease_size(self, budget_micro: int) -> int:
        return max(1, math.ceil(budget_micro * self._fraction))

    async def lease(self, tenant_id: str, month: str, budget_micro: int) -> Lease:
        """This region's lease of the tenant's month: from memory; the first time, read from the
        regional Redis, and taken from home if the region holds none yet."""
        lease = self._leases.get((tenant_id, month))
        if lease is None:
            for earlier in [k for k in self._leases if k[0] == tenant_id and k[1] < month]:
                del self._leases[earlier]  # a month that has ended
            lease = Lease(budget_micro, int(await self._read_granted(tenant_id, month) or 0))
            self._leases[(tenant_id, month)] = lease
            if lease.granted_micro == 0:
                await self.take(tenant_id, month)
        return lease

    @redis_errors
    async def _read_granted(self, tenant_id: str, month: str) -> str | None:
        found: str | None = await self._regional.redis.get(self._granted_key(tenant_id, month))
        return found

    def spent(self, lease: Lease, spent_micro: int) -> None:
        """An admit saw the region's spend: renew in the background once less than half a lease is left."""
        lease.spent_micro = spent_micro
        if lease.left_micro < self.lease_size(lease.budget_micro) / 2:
            self._wake.set()

    async def take(self, tenant_id: str, month: str, need_micro: int = 0) -> bool:
        """Take a lease from home now (at least `need_micro`); False if home has no budget left or
        cannot be reached (then nobody waits on it again for a moment)."""
        lease = self._leases[(tenant_id, month)]
        if time.monotonic() < max(self._home_down_until, lease.home_empty_until):
            return False
        try:
            return await self._take(tenant_id, month, lease, need_micro)
        except StoreUnavailable as exc:
            self._home_down_until = time.monotonic() + _HOME_DOWN_S
            log.warning("the home region is unreachable: no new budget lease", tenant=tenant_id, reason=str(exc))
            return False

    @redis_errors
    async def _take(self, tenant_id: str, month: str, lease: Lease, need_micro: int) -> bool:
        want = max(self.lease_size(lease.budget_micro), need_micro)
        home_key = f"{self._home.names.p}budget_lease:{tenant_id}:{month}"
        given = int(await self._grant(keys=[home_key], args=[self._region, want, lease.budget_micro]))
        if given <= 0:
            lease.home_empty_until = time.monotonic() + self._interval_s
            return False
        # Added here at once: a grant lost on the way back strands its budget, it is never counted twice.
        lease.granted_micro = int(await self._regional.redis.incrby(self._granted_key(tenant_id, month), given))
        log.info("budget lease taken", tenant=tenant_id, month=month, granted=lease.granted_micro, given=given)
        return True

    def _granted_key(self, tenant_id: str, month: str) -> str:
        return f"{self._regional.names.p}budget_granted:{tenant_id}:{month}"

    async def run(self) -> None:
        """The background loop: re-read the region's grants, renew the leases running low."""
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self._interval_s)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self._refresh()
                for (tenant_id, month), lease in list(self._leases.items()):
                    if lease.granted_micro > 0 and lease.left_micro < self.lease_size(lease.budget_micro) / 2:
                        await self.take(tenant_id, month)
            except (RedisError, StoreUnavailable) as exc:
                log.warning("budget leases not refreshed", reason=str(exc))

    async def _refresh(self) -> None:
        """The grants as the regional Redis holds them (another replica of the region may have taken one;
        a store that lost its data holds none)."""
        keys = list(self._leases)
        if not keys:
            return
        values = await self._regional.redis.mget([self._granted_key(t, m) for t, m in keys])
        for key, value in zip(keys, values):
            self._leases[key].granted_micro = int(value or 0)
