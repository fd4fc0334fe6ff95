"""The router: candidates from the store, region order, in-flight counts released exactly once."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from backends.client import BackendClient, Endpoint
from gateway.context import Principal, RequestContext
from gateway.errors import OutOfCapacity
from gateway.fleet.catalog import ModelSpec
from gateway.fleet.monitor import BackendMonitor, MonitorIntervals
from gateway.metrics import GatewayMetrics
from gateway.pipeline.routing import Router
from gateway.pipeline.tenant_salt import TenantSalts, derive_cache_salt
from gateway.store import Store
from gateway.store.models import ApiKey, Tenant
from policies.factory import build_policy
from policies.prefix import block_hashes
from policies.regions import RegionPreference
from tests.gateway.fixtures_context import context_now
from tests.gateway.store.calls import get_session, match_prefix

MODEL = ModelSpec(id="@cf/test/m", backend_model="m", block_size=4)
ENDPOINTS = [
    Endpoint("near-1", "http://127.0.0.1:1", "near"),
    Endpoint("near-2", "http://127.0.0.1:2", "near"),
    Endpoint("far-1", "http://127.0.0.1:3", "far"),
]
PROMPT = list(range(20))  # five full blocks
SALT_SECRET = "routing-test-salt-secret"
T1_SALT = derive_cache_salt(SALT_SECRET.encode(), "t1")


@pytest.fixture
async def router(store: Store) -> AsyncIterator[Router]:
    client = BackendClient()
    metrics = GatewayMetrics()
    monitor = BackendMonitor(ENDPOINTS, client, store.routing, metrics, MonitorIntervals())
    salts = TenantSalts(store.tenancy, SALT_SECRET)
    yield Router(store.routing, build_policy("cache_aware"), RegionPreference("near", ("far",)), monitor, metrics, salts)
    await client.aclose()


def context(tenant: str, session: str | None) -> RequestContext:
    key = ApiKey("k1", tenant, "edg_x", None, None, None, time.time())
    principal = Principal(key, Tenant(tenant, tenant, ("acc",), None, None, time.time()), "acc")
    return context_now("r", principal, MODEL, session)


async def route(router: Router, tenant: str = "t1", session: str | None = None, prompt: list[int] = PROMPT):  # noqa: ANN201
    return await router.route(context(tenant, session), ENDPOINTS, prompt, max_tokens=8)


async def test_own_region_first_then_the_rest(router: Router, store: Store) -> None:
    flight = await route(router)
    assert [e.region for e in flight.endpoints] == ["near", "near", "far"]
    assert await store.routing.loads() == {flight.chosen.id: (20, 8)}
    await router.finished(flight, success=True)
    await router.finished(flight, success=True)  # idempotent
    assert await store.routing.loads() == {}


async def test_a_cached_prefix_attracts_the_request_and_lowers_its_prefill(router: Router, store: Store) -> None:
    await store.routing.record_prefix("near-2", block_hashes(PROMPT, 4, T1_SALT)[:4])
    flight = await route(router)
    assert flight.chosen.id == "near-2"
    assert flight.expected_cached_tokens == 16
    assert flight.prefill_tokens == 4
    # the decision explains itself: near-2's 16 cached tokens make its cost 4 (+ no load)
    assert flight.explanation.startswith("chosen=near-2 ")
    assert "near-2:cached=16,load=0,score=4" in flight.explanation
    # another tenant's identical prompt hashes differently: no cache credit
    other = await route(router, tenant="t2")
    assert other.expected_cached_tokens == 0


async def test_the_cache_salt_is_a_keyed_hash_of_the_tenant(router: Router, store: Store) -> None:
    flight = await route(router)
    assert flight.cache_salt == T1_SALT != "t1" and len(T1_SALT) == 64  # HMAC-SHA256, hex
    assert flight.hashes == block_hashes(PROMPT, 4, T1_SALT)  # the chain the backend's events report
    assert flight.hashes != block_hashes(PROMPT, 4, "t1")  # knowing the tenant id is not enough
    await router.finished(flight, success=True)


async def test_prefill_leaves_at_first_token_decode_at_the_end(router: Router, store: Store) -> None:
    flight = await route(router)
    await router.started(flight, flight.chosen)
    await router.first_token(flight)
    assert await store.routing.loads() == {flight.chosen.id: (0, 8)}
    await router.finished(flight, success=True)
    assert await store.routing.loads() == {}
    # started recorded the prompt's blocks on the backend that answered
    assert await match_prefix(store, block_hashes(PROMPT, 4, T1_SALT)) == {flight.chosen.id: 5}


async def test_failover_moves_the_counts_and_pins_the_session(router: Router, store: Store) -> None:
    flight = await route(router, session="s1")
    fallback = flight.endpoints[1]
    await router.started(flight, fallback)
    assert await store.routing.loads() == {fallback.id: (20, 8)}
    assert await get_session(store, "t1", "s1") == fallback.id
    await router.finished(flight, success=True)
    assert await store.routing.loads() == {}
    again = await route(router, session="s1")
    assert again.info.previous_backend_id == fallback.id and again.chosen.id == fallback.id
    await router.finished(again, success=True)


async def test_unhealthy_backends_are_skipped_and_none_left_is_an_error(router: Router) -> None:
    router.monitor.mark_unhealthy("near-1", "test")
    router.monitor.mark_unhealthy("near-2", "test")
    flight = await route(router)
    assert [e.id for e in flight.endpoints] == ["far-1"]
    await router.finished(flight, success=True)
    router.monitor.mark_unhealthy("far-1", "test")
    with pytest.raises(OutOfCapacity):
        await route(router)
