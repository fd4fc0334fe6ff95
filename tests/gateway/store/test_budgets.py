from __future__ import annotations

import asyncio

import pytest

from gateway.store import InvalidArgument, Store
from tests.gateway.store.conftest import OpenStore


async def test_reserve_up_to_the_budget_exactly(store: Store) -> None:
    first = await store.reserve_budget("acme", "2026-05", 600, 1000)
    assert first.allowed and first.spent_micro == 600
    refused = await store.reserve_budget("acme", "2026-05", 401, 1000)
    assert not refused.allowed and refused.spent_micro == 600  # nothing added
    exact = await store.reserve_budget("acme", "2026-05", 400, 1000)
    assert exact.allowed and exact.spent_micro == 1000
    assert not (await store.reserve_budget("acme", "2026-05", 1, 1000)).allowed
    assert (await store.reserve_budget("acme", "2026-06", 1, 1000)).allowed  # a new month
    assert (await store.reserve_budget("other", "2026-05", 1000, 1000)).allowed  # another tenant
    assert await store.budget_spent("acme", "2026-05") == 1000


async def test_unlimited_budget_still_counts(store: Store) -> None:
    big = 2**52  # micro-units stay exact far beyond any real bill
    assert (await store.reserve_budget("acme", "2026-05", big, None)).allowed
    assert (await store.reserve_budget("acme", "2026-05", 3, None)).spent_micro == big + 3


async def test_settle_replaces_the_reservation_with_the_actual_cost(store: Store) -> None:
    await store.reserve_budget("acme", "2026-05", 500, 1000)
    assert await store.settle_budget("acme", "2026-05", 500, 120) == 120
    assert await store.settle_budget("acme", "2026-05", 0, 30) == 150  # cost above the reservation
    assert await store.settle_budget("acme", "2026-05", 10_000, 0) == 0  # never below zero
    assert await store.budget_spent("acme", "2026-05") == 0


async def test_concurrent_reservations_never_overspend(pair: tuple[Store, Store]) -> None:
    a, b = pair
    decisions = await asyncio.gather(*(s.reserve_budget("acme", "2026-05", 30, 1000) for s in [a, b] * 25))
    assert sum(d.allowed for d in decisions) == 33
    assert await a.budget_spent("acme", "2026-05") == 990
    await asyncio.gather(*(s.settle_budget("acme", "2026-05", 30, 20) for s in [a, b] * 16 + [a]))
    assert await b.budget_spent("acme", "2026-05") == 33 * 20


async def test_spend_survives_reopen(open_instance: OpenStore) -> None:
    first = open_instance()
    await first.reserve_budget("acme", "2026-05", 700, 1000)
    await first.settle_budget("acme", "2026-05", 700, 650)
    await first.aclose()
    second = open_instance()
    assert await second.budget_spent("acme", "2026-05") == 650
    assert not (await second.reserve_budget("acme", "2026-05", 351, 1000)).allowed


@pytest.mark.parametrize("month", ["2026-13", "2026-5", "May", ""])
async def test_bad_month_or_amount_is_refused(store: Store, month: str) -> None:
    with pytest.raises(InvalidArgument, match="month"):
        await store.reserve_budget("acme", month, 1, 10)
    with pytest.raises(InvalidArgument, match="amount_micro"):
        await store.reserve_budget("acme", "2026-05", -1, 10)
