"""Glue between the stores and `policies.limits` (the sliding-window arithmetic).

Both per-minute limits use the two-counter sliding window over 60 s windows, in integer
milliseconds. The local store calls `policies.limits.sliding_window` directly; the Redis
store runs the same arithmetic in Lua (`redis/scripts.py` `SLIDING_WINDOW_LUA`, cross-checked
against the Python in the tests) so that one script both decides and counts.
"""

from __future__ import annotations

import math

from gateway.store.checks import check_count, check_id
from gateway.store.errors import TokensOverLimit
from gateway.store.models import LimitDecision

WINDOW_MS = 60_000
ALLOWED = LimitDecision(allowed=True, retry_after_s=0.0, which=None)


def to_ms(now: float) -> int:
    return math.floor(now * 1000)


def limits_apply(key_id: str, rpm: int | None, tpm: int | None, tokens_estimate: int) -> bool:
    """Whether `check_and_consume` has a limit to count against (False: it allows, counting nothing).
    Raises InvalidArgument for a bad argument and TokensOverLimit for an estimate no window can hold."""
    check_id("key id", key_id)
    check_count("rpm", rpm, allow_none=True, positive=True)
    check_count("tpm", tpm, allow_none=True, positive=True)
    check_count("tokens_estimate", tokens_estimate)
    if tpm is not None and tokens_estimate > tpm:
        raise TokensOverLimit(tokens_estimate, tpm)
    return rpm is not None or tpm is not None


def refused(rpm_retry_ms: int | None, tpm_retry_ms: int | None) -> LimitDecision:
    """The decision when at least one limit refused (its retry is not None); the later one is named."""
    if tpm_retry_ms is not None and (rpm_retry_ms is None or tpm_retry_ms > rpm_retry_ms):
        return LimitDecision(allowed=False, retry_after_s=tpm_retry_ms / 1000, which="tpm")
    assert rpm_retry_ms is not None
    return LimitDecision(allowed=False, retry_after_s=rpm_retry_ms / 1000, which="rpm")
