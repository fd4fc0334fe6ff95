"""The admin token check: Bearer only, constant-time, failures throttled per address, listener and surface; a long token."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.errors import AuthenticationFailed
from gateway.http.admin_guard import AdminGuard, AdminThrottled, presented_bearer
from gateway.settings import GatewaySettings
from tests.clock import Clock

TOKEN = "a" * 40


def test_only_the_bearer_scheme_carries_the_token() -> None:
    assert presented_bearer(f"Bearer {TOKEN}") == TOKEN
    assert presented_bearer(f"bearer {TOKEN}") == TOKEN  # the scheme is case-insensitive
    assert presented_bearer(TOKEN) is None  # a bare token was accepted before
    assert presented_bearer(f"Basic {TOKEN}") is None
    assert presented_bearer("Bearer ") is None and presented_bearer(None) is None


def test_failures_are_throttled_per_address_even_for_the_right_token() -> None:
    clock = Clock()
    guard = AdminGuard(TOKEN, max_failures=3, window_s=60, clock=clock)
    guard.check(f"Bearer {TOKEN}", "10.0.0.1", "admin")
    for _ in range(3):
        with pytest.raises(AuthenticationFailed):
            guard.check("Bearer wrong", "10.0.0.1", "admin")
    with pytest.raises(AdminThrottled) as throttled:
        guard.check(f"Bearer {TOKEN}", "10.0.0.1", "admin")
    assert throttled.value.status == 429 and throttled.value.code == 971
    assert throttled.value.retry_after_s == pytest.approx(60)
    guard.check(f"Bearer {TOKEN}", "10.0.0.2", "admin")  # another address is not affected
    assert not guard.matches(TOKEN, "10.0.0.1", "admin")  # nor does the explain header help while throttled
    clock.now += 60.5
    guard.check(f"Bearer {TOKEN}", "10.0.0.1", "admin")  # the window passed


def test_failures_on_the_public_listener_never_throttle_the_admin_listener() -> None:
    """Ten wrong x-edgerun-explain headers from a tenant behind the operator's address (a proxy,
    `edgerun dev` on loopback) made the admin listener refuse the right token for a minute."""
    guard = AdminGuard(TOKEN, max_failures=3, window_s=60, clock=Clock())
    for _ in range(10):
        assert not guard.matches("wrong", "127.0.0.1", "public")
    assert not guard.matches(TOKEN, "127.0.0.1", "public")  # throttled there
    guard.check(f"Bearer {TOKEN}", "127.0.0.1", "admin")  # the operator gets in
    for _ in range(3):
        with pytest.raises(AuthenticationFailed):
            guard.check("Bearer wrong", "127.0.0.1", "admin")
    with pytest.raises(AdminThrottled):  # and the admin listener still throttles its own guessers
        guard.check(f"Bearer {TOKEN}", "127.0.0.1", "admin")


def test_a_tenants_failures_never_throttle_the_admin_api_on_one_listener_either() -> None:
    """Without an admin listener everything is on the public one: ten wrong explain headers or
    mistyped dashboard keys from a tenant behind the operator's address (a proxy) refused the
    operator's admin token there for a minute."""
    guard = AdminGuard(TOKEN, max_failures=3, window_s=60, clock=Clock())
    for _ in range(10):
        assert not guard.matches("wrong", "10.0.0.9", "public")
        with pytest.raises((AuthenticationFailed, AdminThrottled)):  # 401 three times, then 429
            guard.check("Bearer a-mistyped-key", "10.0.0.9", "public", "dashboard")
    assert not guard.matches(TOKEN, "10.0.0.9", "public")  # each surface throttles its own guessers
    with pytest.raises(AdminThrottled):
        guard.check(f"Bearer {TOKEN}", "10.0.0.9", "public", "dashboard")
    guard.check(f"Bearer {TOKEN}", "10.0.0.9", "public")  # the operator gets in


def test_the_table_of_failing_addresses_is_bounded() -> None:
    guard = AdminGuard(TOKEN, max_failures=1, max_clients=100, clock=Clock())
    for i in range(1000):
        with pytest.raises(AuthenticationFailed):
            guard.check("Bearer wrong", f"10.0.{i // 256}.{i % 256}", "public")
    assert len(guard._failures[("public", "admin")]) == 100


def test_no_configured_token_refuses_everything() -> None:
    with pytest.raises(AuthenticationFailed):
        AdminGuard(None).check("Bearer ", "10.0.0.1", "admin")


def test_a_short_admin_token_is_a_clear_settings_error() -> None:
    with pytest.raises(ValidationError, match="at least 32 characters"):
        GatewaySettings(redis_url=None, admin_token="short-admin-token")
    assert GatewaySettings(redis_url=None, admin_token="x" * 32).http.admin_token is not None
