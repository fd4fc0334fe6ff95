"""Per-tenant concurrency: requests in flight per tenant, counted atomically across replicas."""

from __future__ import annotations

import asyncio

import pytest

from gateway.store import InvalidArgument, Store
from tests.gateway.store.conftest import OpenStore


async def test_slots_are_shared_by_replicas_and_freed_on_release(pair: tuple[Store, Store]) -> None:
    a, b = pair
    assert await a.acquire_request_slot("acme", "r1", limit=2)
    assert await b.acquire_request_slot("acme", "r2", limit=2)
    assert not await a.acquire_request_slot("acme", "r3", limit=2)  # full, whichever replica asks
    assert not await b.acquire_request_slot("acme", "r3", limit=2)
    assert await b.acquire_request_slot("beta", "r4", limit=2)  # another tenant has its own count
    await a.release_request_slot("acme", "r2")  # any replica may release
    assert await b.acquire_request_slot("acme", "r3", limit=2)
    await a.release_request_slot("acme", "r3")
    await a.release_request_slot("acme", "r3")  # twice: a no-op
    assert await a.acquire_request_slot("acme", "r5", limit=2)
    assert not await a.acquire_request_slot("acme", "r6", limit=2)


async def test_racing_acquisitions_never_exceed_the_limit(pair: tuple[Store, Store]) -> None:
    a, b = pair
    granted = await asyncio.gather(*(s.acquire_request_slot("acme", f"r{i}", limit=5) for i, s in
                                     enumerate([a, b] * 20)))
    assert sum(granted) == 5


async def test_bad_arguments(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        await store.acquire_request_slot("acme", "r1", limit=0)
    with pytest.raises(InvalidArgument):
        await store.acquire_request_slot("no:colons", "r1", limit=1)


async def test_a_crashed_replicas_slots_expire_a_live_ones_do_not(kind: str, open_instance: OpenStore) -> None:
    if kind == "embedded":
        pytest.skip("embedded: the slots live in the one process and end with it")
    if kind == "hosted":
        pytest.skip("hosted: no lease; a worker's slots end with its connection, at once (test_host_process.py)")
    crashed, live = open_instance(inflight_lease_s=0.45), open_instance(inflight_lease_s=0.45)
    assert await crashed.acquire_request_slot("acme", "r1", limit=2)
    assert await live.acquire_request_slot("acme", "r2", limit=2)
    crashed._lease._task.cancel()  # type: ignore[union-attr]  # a crash: no renewals, no release
    assert not await live.acquire_request_slot("acme", "r3", limit=2)
    await asyncio.sleep(0.7)  # past the lease; the live replica renewed its own slot meanwhile
    assert await live.acquire_request_slot("acme", "r3", limit=2)  # r1 expired
    assert not await live.acquire_request_slot("acme", "r4", limit=2)  # r2 did not


async def test_the_tenant_setting_round_trips(open_instance: OpenStore) -> None:
    store = open_instance()
    acme = await store.create_tenant("Acme", ["a1"], tenant_id="acme", max_concurrent_requests=3)
    plain = await store.create_tenant("Plain", ["a2"], tenant_id="plain")
    assert acme.max_concurrent_requests == 3 and plain.max_concurrent_requests is None
    again = open_instance()  # another replica, or the embedded store reopened from its file
    assert (await again.get_tenant("acme")) == acme and (await again.get_tenant("plain")) == plain
    with pytest.raises(InvalidArgument):
        await store.create_tenant("Bad", ["a3"], max_concurrent_requests=0)
