from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.store import Store, TokensOverLimit
from gateway.store.errors import InvalidArgument
from policies.limits import WindowRule, sliding_window

T0 = 28_333_334 * 60.0  # the start of a one-minute window (epoch seconds)


async def test_rpm_allows_exactly_the_limit_then_refuses(store: Store) -> None:
    decisions = [await store.check_and_consume("key_a", 5, None, 0, T0 + 1) for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    refused = decisions[-1]
    assert refused.which == "rpm" and refused.retry_after_s > 0
    assert all(d.retry_after_s == 0 and d.which is None for d in decisions[:5])


async def test_tpm_boundary_and_refusals_count_nothing(store: Store) -> None:
    assert (await store.check_and_consume("key_a", None, 100, 60, T0)).allowed
    assert not (await store.check_and_consume("key_a", None, 100, 41, T0)).allowed
    refused = await store.check_and_consume("key_a", None, 100, 41, T0)
    assert refused.which == "tpm" and refused.retry_after_s > 0
    assert (await store.check_and_consume("key_a", None, 100, 40, T0)).allowed  # exactly 100
    assert (await store.check_and_consume("key_a", None, 100, 0, T0)).allowed
    assert not (await store.check_and_consume("key_a", None, 100, 1, T0)).allowed


async def test_both_limits_must_pass_and_a_refusal_consumes_neither(store: Store) -> None:
    assert (await store.check_and_consume("key_a", 2, 100, 90, T0)).allowed
    decision = await store.check_and_consume("key_a", 2, 100, 20, T0)  # rpm has room, tpm not
    assert not decision.allowed and decision.which == "tpm"
    assert (await store.check_and_consume("key_a", 2, 100, 10, T0)).allowed  # rpm was not spent by the refusal
    decision = await store.check_and_consume("key_a", 2, 100, 0, T0)
    assert not decision.allowed and decision.which == "rpm"


async def test_retry_after_is_when_the_same_request_first_fits(store: Store) -> None:
    for _ in range(20):
        assert (await store.check_and_consume("key_a", 20, None, 0, T0)).allowed
    refused = await store.check_and_consume("key_a", 20, None, 0, T0)
    expected = sliding_window(0, 20, 1, WindowRule(20, 60_000), round(T0 * 1000)).retry_after_ms
    assert expected is not None and refused.retry_after_s == expected / 1000 == 63.0  # next window, once 1/20 of the old one slid out
    assert not (await store.check_and_consume("key_a", 20, None, 0, T0 + refused.retry_after_s - 0.01)).allowed
    assert (await store.check_and_consume("key_a", 20, None, 0, T0 + refused.retry_after_s)).allowed


async def test_previous_window_weighs_by_its_remaining_share(store: Store) -> None:
    for _ in range(20):
        assert (await store.check_and_consume("key_a", 20, None, 0, T0 + 10)).allowed
    halfway = T0 + 60 + 30  # half of the previous window still counts: 10 of its 20
    allowed = [(await store.check_and_consume("key_a", 20, None, 0, halfway)).allowed for _ in range(12)]
    assert allowed == [True] * 10 + [False] * 2
    assert all([(await store.check_and_consume("key_a", 20, None, 0, T0 + 180)).allowed for _ in range(20)])


async def test_keys_are_independent_and_no_limit_means_no_limit(store: Store) -> None:
    assert (await store.check_and_consume("key_a", 1, None, 0, T0)).allowed
    assert not (await store.check_and_consume("key_a", 1, None, 0, T0)).allowed
    assert (await store.check_and_consume("key_b", 1, None, 0, T0)).allowed
    assert all([(await store.check_and_consume("key_c", None, None, 10**9, T0)).allowed for _ in range(50)])


async def test_estimate_above_tpm_can_never_fit(store: Store) -> None:
    with pytest.raises(TokensOverLimit, match="101 tokens"):
        await store.check_and_consume("key_a", None, 100, 101, T0)
    for bad in ({"rpm": 0}, {"tpm": -5}, {"tokens_estimate": -1}, {"key_id": "a:b"}):
        args: dict[str, Any] = {"key_id": "key_a", "rpm": 10, "tpm": 100, "tokens_estimate": 1, "now": T0} | bad
        with pytest.raises(InvalidArgument):
            await store.check_and_consume(**args)


async def test_reconcile_refunds_and_charges_the_difference(store: Store) -> None:
    assert (await store.check_and_consume("key_a", None, 100, 80, T0)).allowed
    await store.reconcile_tokens("key_a", 80, 30, T0 + 1)  # 30 used, 70 left
    assert not (await store.check_and_consume("key_a", None, 100, 71, T0 + 1)).allowed
    assert (await store.check_and_consume("key_a", None, 100, 70, T0 + 1)).allowed
    await store.reconcile_tokens("key_a", 70, 70, T0 + 1)  # no-op
    await store.reconcile_tokens("key_a", 0, 5, T0 + 2)  # the response was longer than estimated
    assert not (await store.check_and_consume("key_a", None, 100, 0, T0 + 2)).allowed


async def test_refund_never_drives_counters_negative(store: Store) -> None:
    assert (await store.check_and_consume("key_a", None, 100, 10, T0)).allowed
    await store.reconcile_tokens("key_a", 1000, 0, T0)
    allowed = [(await store.check_and_consume("key_a", None, 100, 25, T0)).allowed for _ in range(5)]
    assert allowed == [True] * 4 + [False]


async def test_concurrent_replicas_allow_exactly_the_limit(pair: tuple[Store, Store]) -> None:
    a, b = pair
    decisions = await asyncio.gather(
        *(s.check_and_consume("key_hot", 20, None, 0, T0 + 5) for s in [a, b] * 25)
    )
    assert sum(d.allowed for d in decisions) == 20
    assert all(d.which == "rpm" and d.retry_after_s > 0 for d in decisions if not d.allowed)


async def test_concurrent_token_spend_never_exceeds_tpm(pair: tuple[Store, Store]) -> None:
    a, b = pair
    decisions = await asyncio.gather(
        *(s.check_and_consume("key_hot", None, 1000, 70, T0 + 5) for s in [a, b] * 20)
    )
    assert sum(d.allowed for d in decisions) == 1000 // 70
