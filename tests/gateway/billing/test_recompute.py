"""Bills recomputed from raw usage and the price version each record names."""

from __future__ import annotations

import dataclasses
import time

from contracts.usage import Usage
from gateway.billing.metering import MeteredRequest, Metering
from gateway.billing.prices import PriceHistory
from gateway.billing.recompute import recompute
from gateway.fleet.catalog import ModelSpec
from gateway.metrics import GatewayMetrics
from gateway.pipeline.auth import Authenticator
from gateway.store import Store
from gateway.store.models import UsageStatus
from policies.pricing import PriceTable
from tests.gateway.fixtures_context import context_now

V1 = {"m": {"version": "v1", "input": "0.60", "cached_input": "0.10", "output": "3"}}
V2 = {"m": {"version": "v2", "input": "1.20", "output": "6"}}  # no cached rate: cached billed as input
CASES: list[tuple[UsageStatus, Usage]] = [
    ("ok", Usage(1000, 10, 800)),
    ("cancelled", Usage(333, 7, 16)),
    ("backend_error", Usage(500, 0, 0)),  # before the first token: free
    ("backend_error", Usage(500, 3, 0)),  # midway: free as well (the answer is broken)
    ("rejected", Usage(50, 0, 0)),
]


async def bill(store: Store, prices: dict, prefix: str) -> None:
    if await store.tenancy.get_tenant("ta") is None:
        await store.tenancy.create_tenant("A", ["acc"], tenant_id="ta")
    _, secret = await store.tenancy.create_key("ta")
    principal = await Authenticator(store).authenticate(f"Bearer {secret}", "acc")
    metering = Metering(store, PriceTable.from_config(prices), GatewayMetrics())
    for i, (status, usage) in enumerate(CASES):
        ctx = context_now(f"{prefix}-{i}", principal, ModelSpec(id="m", backend_model="m"))
        request = MeteredRequest(ctx, usage.prompt_tokens)
        await metering.settle(request, usage, status=status, backend_id="b", region="r")


async def test_records_recompute_to_what_was_billed_after_a_price_change(store: Store) -> None:
    await bill(store, V1, "old")
    await bill(store, V2, "new")
    records = [r async for r in store.ledger.iter_usage(0, time.time() + 1)]
    assert {r.price_version for r in records} == {"v1", "v2"}
    costs = {r.request_id: r.cost_micro for r in records}
    assert costs["old-0"] == 230 and costs["new-0"] == 1260  # 200 x .6 + 800 x .1 + 10 x 3; 1000 x 1.2 + 10 x 6
    assert costs["old-1"] == 213  # 317 x 0.6 + 16 x 0.1 + 7 x 3 = 212.8, rounded half up
    assert costs["old-2"] == costs["old-3"] == costs["old-4"] == 0  # failures cost nothing

    history = PriceHistory.from_config(V2, {"m": [V1["m"]]})
    result = recompute(records, history)
    assert len(result.repriced) == 10 and not result.mismatches and not result.unknown_versions
    assert result.total_recomputed_micro == result.total_recorded_micro == sum(costs.values())
    saved = {r.request_id: r.charge.savings_micros for r in result.repriced if r.charge is not None}
    assert saved["old-0"] == 400 and saved["new-0"] == 0  # 800 cached x (0.6 - 0.1); v2 has no discount

    tampered = [dataclasses.replace(r, cost_micro=r.cost_micro + 1) if r.request_id == "old-1" else r for r in records]
    assert [m.request_id for m in recompute(tampered, history).mismatches] == ["old-1"]
    only_current = recompute(records, PriceHistory.from_config(V2))
    assert sorted(r.request_id for r in only_current.unknown_versions) == [f"old-{i}" for i in range(5)]
