"""A varied ledger for the export tests: tenants, models, statuses, awkward metadata, price versions."""

from __future__ import annotations

import random

from gateway.billing.prices import PriceHistory
from gateway.billing.recompute import reprice
from gateway.store import Store
from gateway.store.models import USAGE_STATUSES, UsageRecord

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
CURRENT = {
    "@cf/a/big": {"version": "v2", "input": "0.60", "cached_input": "0.10", "output": "3", "input_neurons": "50000",
                  "output_neurons": "250000"},
    "@cf/a/small": {"version": "s1", "input": "0.027", "output": "0.201"},
}
OLD = {"@cf/a/big": [{"version": "v1", "input": "0.50", "cached_input": "0.05", "output": "2.5"}]}
HISTORY = PriceHistory.from_config(CURRENT, OLD)
AWKWARD = [{}, {"job": "nightly, \"batch\""}, {"user": "zoë", "n": 3, "ok": True}, {"line": "a\nb"}]


def records(n: int = 60, seed: int = 7) -> list[UsageRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        model = rng.choice(sorted(CURRENT))
        version = rng.choice(["v1", "v2"]) if model == "@cf/a/big" else "s1"
        prompt = rng.randint(1, 5000)
        cached = rng.choice([0, prompt // 2, prompt])
        status = rng.choice(USAGE_STATUSES)
        completion = 0 if status == "rejected" else rng.randint(0, 300)
        ended = T0 + i * 0.5 + rng.random() / 10
        record = UsageRecord(
            request_id=f"req-{i:03d}", tenant_id=rng.choice(["acme", "zeta"]), account_id="acc", key_id=f"k{i % 3}",
            model=model, region=rng.choice(["eu", None]), backend_id=rng.choice(["b1", "b2"]),
            session_id=rng.choice([None, f"s{i % 5}"]), started_at=ended - rng.random() * 3, ended_at=ended,
            status=status, prompt_tokens=prompt, cached_tokens=cached, completion_tokens=completion,
            price_version=version, cost_micro=0, metadata=rng.choice(AWKWARD),
        )
        charge = reprice(record, HISTORY)
        assert charge is not None
        record.cost_micro = charge.cost_micros
        out.append(record)
    return out


async def fill(store: Store, items: list[UsageRecord]) -> None:
    for record in reversed(items):  # written out of order: the export must not depend on it
        assert await store.ledger.append(record)
