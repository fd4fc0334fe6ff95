from __future__ import annotations

import pytest

from policies.sim.backend import SimBackend
from policies.sim.kv_cache import LRUBlockCache


def backend() -> SimBackend:
    return SimBackend("b0", LRUBlockCache(8), prefill_tokens_per_s=1000.0, decode_tokens_per_s=10.0)


def test_prefill_is_a_fifo_queue_and_ttft_includes_waiting() -> None:
    b = backend()
    assert b.admit(0.0, 2000, 10) == pytest.approx(2.0)
    assert b.admit(1.0, 500, 10) == pytest.approx(1.5)  # waits until 2.0, then 0.5 s
    assert b.admit(5.0, 0, 10) == pytest.approx(0.0)  # queue empty, nothing to prefill


def test_in_flight_tokens_fall_linearly_and_requests_are_forgotten() -> None:
    b = backend()
    b.admit(0.0, 2000, 10)  # prefill 0..2 s, decode 2..3 s
    assert b.in_flight(0.0) == (2000, 10)
    assert b.in_flight(1.0) == (1000, 10)
    assert b.in_flight(2.5) == (0, 5)
    assert b.in_flight(3.0) == (0, 0) and not b.running


def test_queued_request_counts_in_full_until_its_prefill_starts() -> None:
    b = backend()
    b.admit(0.0, 1000, 0)
    b.admit(0.0, 1000, 0)
    assert b.in_flight(0.5) == (1500, 0)


def test_token_seconds_integral_matches_sampling() -> None:
    b = backend()
    b.admit(0.0, 2000, 10)
    b.admit(0.5, 1000, 20)
    step = 0.001
    sampled = sum(sum(_in_flight_as_it_happened(i * step)) for i in range(6000)) * step
    assert b.in_flight_token_seconds == pytest.approx(sampled, rel=0.01)
    # by hand: 2000 x 1 + 10 x 2.5 + 1000 x (1.5 + 0.5) + 20 x (2.5 + 1)
    assert b.in_flight_token_seconds == pytest.approx(4095.0)
    assert b.work_tokens == 3030 and b.num_requests == 2


def _in_flight_as_it_happened(now: float) -> tuple[int, int]:
    b = backend()
    b.admit(0.0, 2000, 10)
    if now >= 0.5:
        b.admit(0.5, 1000, 20)
    return b.in_flight(now)
