"""Admission (gateway/store/admission.py): rate windows, budgets and concurrency slots, per backend."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.store import InvalidArgument, Store, TokensOverLimit
from policies.limits import WindowRule, sliding_window
from tests.gateway.store.calls import (
    acquire_request_slot,
    reconcile_tokens,
    release_request_slot,
    reserve_budget,
    settle_budget,
)
from tests.gateway.store.conftest import SHARED_BACKENDS, OpenStore, crash


@pytest.fixture(params=SHARED_BACKENDS)
def kind(request: pytest.FixtureRequest) -> str:
    return request.param

T0 = 28_333_334 * 60.0  # the start of a one-minute window (epoch seconds)


async def test_rpm_allows_exactly_the_limit_then_refuses(store: Store) -> None:
    decisions = [await store.admission.check_and_consume("key_a", 5, None, 0, T0 + 1) for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    refused = decisions[-1]
    assert refused.which == "rpm" and refused.retry_after_s > 0
    assert all(d.retry_after_s == 0 and d.which is None for d in decisions[:5])


async def test_tpm_boundary_and_refusals_count_nothing(store: Store) -> None:
    assert (await store.admission.check_and_consume("key_a", None, 100, 60, T0)).allowed
    assert not (await store.admission.check_and_consume("key_a", None, 100, 41, T0)).allowed
    refused = await store.admission.check_and_consume("key_a", None, 100, 41, T0)
    assert refused.which == "tpm" and refused.retry_after_s > 0
    assert (await store.admission.check_and_consume("key_a", None, 100, 40, T0)).allowed  # exactly 100
    assert (await store.admission.check_and_consume("key_a", None, 100, 0, T0)).allowed
    assert not (await store.admission.check_and_consume("key_a", None, 100, 1, T0)).allowed


async def test_both_limits_must_pass_and_a_refusal_consumes_neither(store: Store) -> None:
    assert (await store.admission.check_and_consume("key_a", 2, 100, 90, T0)).allowed
    decision = await store.admission.check_and_consume("key_a", 2, 100, 20, T0)  # rpm has room, tpm not
    assert not decision.allowed and decision.which == "tpm"
    assert (await store.admission.check_and_consume("key_a", 2, 100, 10, T0)).allowed  # rpm was not spent by the refusal
    decision = await store.admission.check_and_consume("key_a", 2, 100, 0, T0)
    assert not decision.allowed and decision.which == "rpm"


async def test_retry_after_is_when_the_same_request_first_fits(store: Store) -> None:
    for _ in range(20):
        assert (await store.admission.check_and_consume("key_a", 20, None, 0, T0)).allowed
    refused = await store.admission.check_and_consume("key_a", 20, None, 0, T0)
    expected = sliding_window(0, 20, 1, WindowRule(20, 60_000), round(T0 * 1000)).retry_after_ms
    assert expected is not None and refused.retry_after_s == expected / 1000 == 63.0  # next window, once 1/20 of the old one slid out
    assert not (await store.admission.check_and_consume("key_a", 20, None, 0, T0 + refused.retry_after_s - 0.01)).allowed
    assert (await store.admission.check_and_consume("key_a", 20, None, 0, T0 + refused.retry_after_s)).allowed


async def test_previous_window_weighs_by_its_remaining_share(store: Store) -> None:
    for _ in range(20):
        assert (await store.admission.check_and_consume("key_a", 20, None, 0, T0 + 10)).allowed
    halfway = T0 + 60 + 30  # half of the previous window still counts: 10 of its 20
    allowed = [(await store.admission.check_and_consume("key_a", 20, None, 0, halfway)).allowed for _ in range(12)]
    assert allowed == [True] * 10 + [False] * 2
    assert all([(await store.admission.check_and_consume("key_a", 20, None, 0, T0 + 180)).allowed for _ in range(20)])


async def test_keys_are_independent_and_no_limit_means_no_limit(store: Store) -> None:
    assert (await store.admission.check_and_consume("key_a", 1, None, 0, T0)).allowed
    assert not (await store.admission.check_and_consume("key_a", 1, None, 0, T0)).allowed
    assert (await store.admission.check_and_consume("key_b", 1, None, 0, T0)).allowed
    assert all([(await store.admission.check_and_consume("key_c", None, None, 10**9, T0)).allowed for _ in range(50)])


async def test_estimate_above_tpm_can_never_fit(store: Store) -> None:
    with pytest.raises(TokensOverLimit, match="101 tokens"):
        await store.admission.check_and_consume("key_a", None, 100, 101, T0)
    for bad in ({"rpm": 0}, {"tpm": -5}, {"tokens_estimate": -1}, {"key_id": "a:b"}):
        args: dict[str, Any] = {"key_id": "key_a", "rpm": 10, "tpm": 100, "tokens_estimate": 1, "now": T0} | bad
        with pytest.raises(InvalidArgument):
            await store.admission.check_and_consume(**args)


async def test_reconcile_refunds_and_charges_the_difference(store: Store) -> None:
    assert (await store.admission.check_and_consume("key_a", None, 100, 80, T0)).allowed
    await reconcile_tokens(store, "key_a", 80, 30, T0 + 1)  # 30 used, 70 left
    assert not (await store.admission.check_and_consume("key_a", None, 100, 71, T0 + 1)).allowed
    assert (await store.admission.check_and_consume("key_a", None, 100, 70, T0 + 1)).allowed
    await reconcile_tokens(store, "key_a", 70, 70, T0 + 1)  # no-op
    await reconcile_tokens(store, "key_a", 0, 5, T0 + 2)  # the response was longer than estimated
    assert not (await store.admission.check_and_consume("key_a", None, 100, 0, T0 + 2)).allowed


async def test_refund_never_drives_counters_negative(store: Store) -> None:
    assert (await store.admission.check_and_consume("key_a", None, 100, 10, T0)).allowed
    await reconcile_tokens(store, "key_a", 1000, 0, T0)
    allowed = [(await store.admission.check_and_consume("key_a", None, 100, 25, T0)).allowed for _ in range(5)]
    assert allowed == [True] * 4 + [False]


async def test_concurrent_replicas_allow_exactly_the_limit(pair: tuple[Store, Store]) -> None:
    a, b = pair
    decisions = await asyncio.gather(
        *(s.admission.check_and_consume("key_hot", 20, None, 0, T0 + 5) for s in [a, b] * 25)
    )
    assert sum(d.allowed for d in decisions) == 20
    assert all(d.which == "rpm" and d.retry_after_s > 0 for d in decisions if not d.allowed)


async def test_concurrent_token_spend_never_exceeds_tpm(pair: tuple[Store, Store]) -> None:
    a, b = pair
    decisions = await asyncio.gather(
        *(s.admission.check_and_consume("key_hot", None, 1000, 70, T0 + 5) for s in [a, b] * 20)
    )
    assert sum(d.allowed for d in decisions) == 1000 // 70


async def test_reserve_up_to_the_budget_exactly(store: Store) -> None:
    first = await reserve_budget(store, "acme", "2026-05", 600, 1000)
    assert first.allowed and first.spent_micro == 600
    refused = await reserve_budget(store, "acme", "2026-05", 401, 1000)
    assert not refused.allowed and refused.spent_micro == 600  # nothing added
    exact = await reserve_budget(store, "acme", "2026-05", 400, 1000)
    assert exact.allowed and exact.spent_micro == 1000
    assert not (await reserve_budget(store, "acme", "2026-05", 1, 1000)).allowed
    assert (await reserve_budget(store, "acme", "2026-06", 1, 1000)).allowed  # a new month
    assert (await reserve_budget(store, "other", "2026-05", 1000, 1000)).allowed  # another tenant
    assert await store.admission.budget_spent("acme", "2026-05") == 1000


async def test_unlimited_budget_still_counts(store: Store) -> None:
    big = 2**52  # micro-units stay exact far beyond any real bill
    assert (await reserve_budget(store, "acme", "2026-05", big, None)).allowed
    assert (await reserve_budget(store, "acme", "2026-05", 3, None)).spent_micro == big + 3


async def test_settle_replaces_the_reservation_with_the_actual_cost(store: Store) -> None:
    await reserve_budget(store, "acme", "2026-05", 500, 1000)
    assert await settle_budget(store, "acme", "2026-05", 500, 120) == 120
    assert await settle_budget(store, "acme", "2026-05", 0, 30) == 150  # cost above the reservation
    assert await settle_budget(store, "acme", "2026-05", 10_000, 0) == 0  # never below zero
    assert await store.admission.budget_spent("acme", "2026-05") == 0


async def test_concurrent_reservations_never_overspend(pair: tuple[Store, Store]) -> None:
    a, b = pair
    decisions = await asyncio.gather(*(reserve_budget(s, "acme", "2026-05", 30, 1000) for s in [a, b] * 25))
    assert sum(d.allowed for d in decisions) == 33
    assert await a.admission.budget_spent("acme", "2026-05") == 990
    await asyncio.gather(*(settle_budget(s, "acme", "2026-05", 30, 20) for s in [a, b] * 16 + [a]))
    assert await b.admission.budget_spent("acme", "2026-05") == 33 * 20


async def test_spend_survives_reopen(open_instance: OpenStore) -> None:
    first = open_instance()
    await reserve_budget(first, "acme", "2026-05", 700, 1000)
    await settle_budget(first, "acme", "2026-05", 700, 650)
    await first.aclose()
    second = open_instance()
    assert await second.admission.budget_spent("acme", "2026-05") == 650
    assert not (await reserve_budget(second, "acme", "2026-05", 351, 1000)).allowed


@pytest.mark.parametrize("month", ["2026-13", "2026-5", "May", ""])
async def test_bad_month_or_amount_is_refused(store: Store, month: str) -> None:
    with pytest.raises(InvalidArgument, match="month"):
        await reserve_budget(store, "acme", month, 1, 10)
    with pytest.raises(InvalidArgument, match="amount_micro"):
        await reserve_budget(store, "acme", "2026-05", -1, 10)


async def test_slots_are_shared_by_replicas_and_freed_on_release(pair: tuple[Store, Store]) -> None:
    a, b = pair
    assert await acquire_request_slot(a, "acme", "r1", limit=2)
    assert await acquire_request_slot(b, "acme", "r2", limit=2)
    assert not await acquire_request_slot(a, "acme", "r3", limit=2)  # full, whichever replica asks
    assert not await acquire_request_slot(b, "acme", "r3", limit=2)
    assert await acquire_request_slot(b, "beta", "r4", limit=2)  # another tenant has its own count
    await release_request_slot(a, "acme", "r2")  # any replica may release
    assert await acquire_request_slot(b, "acme", "r3", limit=2)
    await release_request_slot(a, "acme", "r3")
    await release_request_slot(a, "acme", "r3")  # twice: a no-op
    assert await acquire_request_slot(a, "acme", "r5", limit=2)
    assert not await acquire_request_slot(a, "acme", "r6", limit=2)


async def test_racing_acquisitions_never_exceed_the_limit(pair: tuple[Store, Store]) -> None:
    a, b = pair
    granted = await asyncio.gather(*(acquire_request_slot(s, "acme", f"r{i}", limit=5) for i, s in
                                     enumerate([a, b] * 20)))
    assert sum(granted) == 5


async def test_bad_arguments(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        await acquire_request_slot(store, "acme", "r1", limit=0)
    with pytest.raises(InvalidArgument):
        await acquire_request_slot(store, "no:colons", "r1", limit=1)


async def test_a_crashed_replicas_slots_expire_a_live_ones_do_not(kind: str, open_instance: OpenStore) -> None:
    if kind == "local":
        pytest.skip("local: the slots live in the one process and end with it")
    crashed, live = open_instance(inflight_lease_s=0.45), open_instance(inflight_lease_s=0.45)
    assert await acquire_request_slot(crashed, "acme", "r1", limit=2)
    assert await acquire_request_slot(live, "acme", "r2", limit=2)
    crash(crashed)  # a crash: no renewals, no release
    assert not await acquire_request_slot(live, "acme", "r3", limit=2)
    await asyncio.sleep(0.7)  # past the lease; the live replica renewed its own slot meanwhile
    assert await acquire_request_slot(live, "acme", "r3", limit=2)  # r1 expired
    assert not await acquire_request_slot(live, "acme", "r4", limit=2)  # r2 did not


async def test_the_tenant_setting_round_trips(open_instance: OpenStore) -> None:
    store = open_instance()
    acme = await store.tenancy.create_tenant("Acme", ["a1"], tenant_id="acme", max_concurrent_requests=3)
    plain = await store.tenancy.create_tenant("Plain", ["a2"], tenant_id="plain")
    assert acme.max_concurrent_requests == 3 and plain.max_concurrent_requests is None
    again = open_instance()  # another replica, or the local store reopened from its file
    assert (await again.tenancy.get_tenant("acme")) == acme and (await again.tenancy.get_tenant("plain")) == plain
    with pytest.raises(InvalidArgument):
        await store.tenancy.create_tenant("Bad", ["a3"], max_concurrent_requests=0)
