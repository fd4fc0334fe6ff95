from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from policies.errors import LimitRuleError
from policies.limits import (
    Decision,
    WindowRule,
    fixed_window,
    key_ttl_ms,
    previous_window_key,
    sliding_window,
    window_key,
)

RULE = WindowRule(limit=10, window_ms=60_000)


def test_window_keys_name_the_window_holding_now() -> None:
    assert window_key("tenant:acme", 125_000, 60_000) == "tenant:acme:60000:2"
    assert window_key("tenant:acme", 179_999, 60_000) == "tenant:acme:60000:2"
    assert window_key("tenant:acme", 180_000, 60_000) == "tenant:acme:60000:3"
    assert previous_window_key("tenant:acme", 125_000, 60_000) == "tenant:acme:60000:1"


def test_key_ttl_covers_the_window_or_one_more_when_sliding() -> None:
    assert key_ttl_ms(125_000, 60_000, sliding=False) == 55_000
    assert key_ttl_ms(125_000, 60_000, sliding=True) == 115_000


def test_fixed_window_allows_up_to_the_limit_then_retries_at_the_next_window() -> None:
    assert fixed_window(9, 1, RULE, 125_000) == Decision(True, 0, 0)
    refused = fixed_window(10, 1, RULE, 125_000)
    assert refused == Decision(False, 0, 55_000) and refused.retry_after_s == 55


def test_a_cost_above_the_limit_can_never_pass() -> None:
    assert fixed_window(0, 11, RULE, 0).retry_after_ms is None
    assert sliding_window(0, 0, 11, RULE, 0).retry_after_s is None


def test_sliding_window_weights_the_previous_window() -> None:
    # 30 s into the window: half of the previous window's 10 still counts -> 5 + 4 + 1 = 10
    assert sliding_window(10, 4, 1, RULE, 30_000).allowed
    refused = sliding_window(10, 5, 1, RULE, 30_000)
    assert not refused.allowed
    assert refused.retry_after_ms == 6_000  # at 36 s, 10 x 24/60 = 4, + 5 + 1 = 10


def test_retry_after_seconds_is_at_least_one() -> None:
    assert Decision(False, 0, 1).retry_after_s == 1
    assert Decision(False, 0, 1001).retry_after_s == 2
    assert Decision(True, 3, 0).retry_after_s == 0


def test_bad_rules_and_counts_are_refused() -> None:
    with pytest.raises(LimitRuleError):
        WindowRule(0, 1000)
    with pytest.raises(LimitRuleError):
        WindowRule(1, 0)
    with pytest.raises(LimitRuleError):
        fixed_window(-1, 1, RULE, 0)


def _sliding_at(prev: int, curr: int, cost: int, rule: WindowRule, now: int, later: int) -> bool:
    """Is the same request allowed at `later`, if nothing else is counted meanwhile?"""
    w = rule.window_ms
    rolled = later // w - now // w
    if rolled == 0:
        return sliding_window(prev, curr, cost, rule, later).allowed
    if rolled == 1:
        return sliding_window(curr, 0, cost, rule, later).allowed
    return sliding_window(0, 0, cost, rule, later).allowed


@given(
    st.integers(1, 50), st.integers(1, 10_000), st.integers(0, 60), st.integers(0, 60), st.integers(0, 60),
    st.integers(0, 10**7),
)
def test_sliding_retry_after_is_the_earliest_allowed_time(
    limit: int, window_ms: int, prev: int, curr: int, cost: int, now: int
) -> None:
    rule = WindowRule(limit, window_ms)
    d = sliding_window(prev, curr, cost, rule, now)
    if d.allowed:
        assert d.retry_after_ms == 0 and 0 <= d.remaining <= limit
    elif d.retry_after_ms is None:
        assert cost > limit
    else:
        assert d.retry_after_ms > 0
        assert _sliding_at(prev, curr, cost, rule, now, now + d.retry_after_ms)
        assert not _sliding_at(prev, curr, cost, rule, now, now + d.retry_after_ms - 1)


@given(st.integers(1, 50), st.integers(1, 10_000), st.integers(0, 60), st.integers(0, 60), st.integers(0, 10**7))
def test_fixed_retry_after_lands_in_a_window_where_it_fits(
    limit: int, window_ms: int, curr: int, cost: int, now: int
) -> None:
    rule = WindowRule(limit, window_ms)
    d = fixed_window(curr, cost, rule, now)
    assert d.allowed == (curr + cost <= limit)
    if not d.allowed and d.retry_after_ms is not None:
        later = now + d.retry_after_ms
        assert later // window_ms == now // window_ms + 1  # the very start of the next window
        assert later % window_ms == 0
        assert fixed_window(0, cost, rule, later).allowed
