"""Metering: one ledger record per request, priced with the cached discount, budgets reserved (with the
request's admission, gateway/pipeline/ticket.py) and settled."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from contracts.usage import Usage
from gateway.billing.metering import UNPRICED, MeteredRequest, Metering
from gateway.errors import BudgetExhausted
from gateway.fleet.catalog import ModelSpec
from gateway.metrics import GatewayMetrics
from gateway.pipeline.auth import Authenticator
from gateway.pipeline.concurrency import TenantSlots
from gateway.pipeline.ticket import Admitter
from gateway.services import Services
from gateway.settings import GatewaySettings
from gateway.store import Store, open_store
from gateway.store.admission import Admitted
from policies.pricing import PriceTable
from tests.gateway.fixtures_context import context_now

MODEL = ModelSpec(id="m", backend_model="m")
PRICES = PriceTable.from_config({"m": {"version": "v1", "input": "0.60", "cached_input": "0.10", "output": "3"}})


async def request_for(store: Store, budget: int | None = None) -> MeteredRequest:
    await store.tenancy.create_tenant("A", ["acc"], tenant_id="ta", monthly_budget_micro=budget)
    _, secret = await store.tenancy.create_key("ta")
    principal = await Authenticator(store).authenticate(f"Bearer {secret}", "acc")
    return MeteredRequest(context_now("req-1", principal, MODEL, "s1"), prompt_tokens=1000)


async def test_one_record_priced_with_the_cached_discount(store: Store) -> None:
    request = await request_for(store)
    metering = Metering(store, PRICES, GatewayMetrics())
    usage = Usage(prompt_tokens=1000, completion_tokens=10, cached_tokens=800)
    assert await metering.settle(request, usage, status="ok", backend_id="b1", region="r") is True
    assert await metering.settle(request, usage, status="ok", backend_id="b1", region="r") is False  # never twice
    record = await store.ledger.get("req-1")
    assert record is not None
    # 200 uncached x 0.60 + 800 cached x 0.10 + 10 out x 3 per 1M tokens = 120 + 80 + 30 micro-units
    assert (record.cost_micro, record.price_version) == (230, "v1")
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (1000, 800, 10)
    assert (record.tenant_id, record.account_id, record.backend_id, record.session_id) == ("ta", "acc", "b1", "s1")


async def test_unpriced_models_are_recorded_at_zero(store: Store) -> None:
    request = await request_for(store)
    request = MeteredRequest(replace(request.ctx, model=ModelSpec(id="other", backend_model="o")), 1000)
    await Metering(store, PRICES, GatewayMetrics()).settle(
        request, Usage(5, 5, 0), status="cancelled", backend_id="b", region=None
    )
    record = await store.ledger.get("req-1")
    assert record is not None and (record.cost_micro, record.price_version, record.status) == (0, UNPRICED, "cancelled")


def admitter_for(store: Store, metering: Metering) -> Admitter:
    return Admitter(store.admission, metering, TenantSlots(None))


async def test_budget_is_reserved_for_the_worst_case_then_settled(store: Store) -> None:
    request = await request_for(store, budget=1000)
    metering = Metering(store, PRICES, GatewayMetrics())
    admitter = admitter_for(store, metering)
    month = time.strftime("%Y-%m", time.gmtime(request.ctx.arrived_at))
    await admitter.admit(request, request.prompt_tokens, 100)  # 1000 x 0.60 + 100 x 3 = 900
    assert await store.admission.budget_spent("ta", month) == 900
    await metering.settle(request, Usage(1000, 10, 800), status="ok", backend_id="b", region=None)
    assert await store.admission.budget_spent("ta", month) == 230
    second = MeteredRequest(context_now("req-2", request.ctx.principal, MODEL), prompt_tokens=1000)
    with pytest.raises(BudgetExhausted) as caught:
        await admitter.admit(second, second.prompt_tokens, 300)  # 600 + 900 = 1500 > 1000 - 230
    assert (caught.value.status, caught.value.code) == (429, 3036)
    assert await store.admission.budget_spent("ta", month) == 230  # a refusal changes nothing


async def test_an_exhausted_budget_refuses_even_a_request_costing_under_half_a_micro_unit(store: Store) -> None:
    # Costs rounded half up: a request worth 0.4 micro-units was free to reserve and to bill, past a
    # spent budget too. Rounded up, it costs 1 and the budget stops it.
    request = await request_for(store, budget=1)
    cheap = PriceTable.from_config({"m": {"version": "v1", "input": "0.10", "output": "0.30"}})  # 0.1 and 0.3 per token
    metering = Metering(store, cheap, GatewayMetrics())
    admitter = admitter_for(store, metering)
    month = time.strftime("%Y-%m", time.gmtime(request.ctx.arrived_at))
    tiny = MeteredRequest(context_now("req-tiny", request.ctx.principal, MODEL), prompt_tokens=1)
    await admitter.admit(tiny, tiny.prompt_tokens, 1)  # 0.4 -> 1: the whole budget
    assert tiny.reservation is not None and tiny.reservation.amount_micro == 1
    await metering.settle(tiny, Usage(1, 1), status="ok", backend_id="b", region=None)
    record = await store.ledger.get("req-tiny")
    assert record is not None and record.cost_micro == 1
    assert await store.admission.budget_spent("ta", month) == 1
    after = MeteredRequest(context_now("req-after", request.ctx.principal, MODEL), prompt_tokens=1)
    with pytest.raises(BudgetExhausted):
        await admitter.admit(after, after.prompt_tokens, 1)
    assert await store.admission.budget_spent("ta", month) == 1


async def cancel_while_queued(store: Store, admitter: Admitter, request: MeteredRequest) -> asyncio.Event:
    """A reservation whose caller is cancelled while it is in flight (held here at a gate, as a
    Redis call would be; the local store decides in memory and saves the spend later); set the
    event returned to let the reservation land."""
    gate = asyncio.Event()
    admit = store.admission.admit

    async def admit_in_flight(*args: Any) -> Admitted:
        await gate.wait()
        return await admit(*args)

    store.admission.admit = admit_in_flight  # type: ignore[method-assign]
    store.admission.admits_at_once = False  # type: ignore[misc]  # it waits at the gate now
    caller = asyncio.create_task(admitter.admit(request, request.prompt_tokens, 100))
    await asyncio.sleep(0.05)  # the reservation is in flight
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    return gate


async def test_a_reservation_whose_caller_is_cancelled_is_given_back(store: Store) -> None:
    # A client that leaves while its budget reservation is in flight cancels the request's task. The
    # store applies the reservation anyway (held at a gate here, as a slow store would hold it;
    # sent to Redis), but the request never learns of it, so nothing settled it: the month's spend
    # kept the worst case for good and refused the tenant early.
    request = await request_for(store, budget=10_000)
    admitter = admitter_for(store, Metering(store, PRICES, GatewayMetrics()))
    month = time.strftime("%Y-%m", time.gmtime(request.ctx.arrived_at))
    landing = await cancel_while_queued(store, admitter, request)
    landing.set()
    for _ in range(200):  # the reservation lands, then its give-back: a few hand-offs
        if await store.admission.budget_spent("ta", month) == 0:
            break
        await asyncio.sleep(0.005)
    assert await store.admission.budget_spent("ta", month) == 0
    assert request.reservation is None


async def test_a_reservation_given_back_while_the_gateway_stops_is_saved(tmp_path: Path) -> None:
    # A client that left during set-up just before shutdown: its reservation lands
    # after the lifespan began closing. The give-back must reach the file before the store closes, or
    # the worst case stays in the month's spend after the restart.
    settings = GatewaySettings(redis_url=None, sqlite_path=str(tmp_path / "g.sqlite3"), tokenizer_cache_dir=None)
    services = await Services.open(settings, GatewayMetrics())
    store = services.store
    request = await request_for(store, budget=10_000)
    services.generator.metering.prices = PRICES
    month = time.strftime("%Y-%m", time.gmtime(request.ctx.arrived_at))
    landing = await cancel_while_queued(store, services.generator.admitter, request)
    stopping = asyncio.create_task(services.aclose())  # the lifespan ends
    await asyncio.sleep(0.05)
    landing.set()
    await stopping
    reopened = open_store(settings.store)
    try:
        assert await reopened.admission.budget_spent("ta", month) == 0
    finally:
        await reopened.aclose()
