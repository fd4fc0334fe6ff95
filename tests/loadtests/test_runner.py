"""The load shapes, driven with a stand-in for the gateway that answers after a fixed delay
(the scheduling is what is tested here; test_bench.py runs them against the real gateway)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from loadtests.bench.client import RequestRecord
from loadtests.bench.runner import Load, run_load
from loadtests.bench.workload import OneShotScript, SessionPlan
from loadtests.tenants import TenantKey

KEY = TenantKey("acme", "t", "acct", "secret")


class Turns:
    def __init__(self, n: int) -> None:
        self.left = n

    def next_body(self, last_reply: str | None) -> dict[str, Any] | None:
        if self.left == 0:
            return None
        self.left -= 1
        return {"reply_was": last_reply}


def plans(num_sessions: int, turns: int) -> list[SessionPlan]:
    return [SessionPlan("agent", KEY, f"s{i}", Turns(turns)) for i in range(num_sessions)]


class Server:
    def __init__(self, delay_s: float, fail_session: str | None = None) -> None:
        self.delay_s = delay_s
        self.fail_session = fail_session
        self.in_flight = self.peak = 0
        self.bodies: list[tuple[str, dict[str, Any]]] = []
        self.start = time.perf_counter()

    async def __call__(self, plan: SessionPlan, body: dict[str, Any]) -> tuple[RequestRecord, str]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.bodies.append((plan.session_id or "", body))
        sent = time.perf_counter() - self.start
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        failed = plan.session_id == self.fail_session
        record = RequestRecord(plan.workload, plan.tenant.name, plan.session_id, sent, e2e_s=self.delay_s,
                               error_code=3040 if failed else None)
        return record, f"reply {len(self.bodies)}"


def test_load_parsing() -> None:
    assert Load.parse("rate:2.5") == Load("rate", 2.5)
    assert Load.parse("concurrency:4").label == "concurrency 4"
    for bad in ("rate", "rate:0", "concurrency:1.5", "burst:3"):
        with pytest.raises(ValueError):
            Load.parse(bad)


async def test_concurrency_runs_sessions_turn_after_turn() -> None:
    server = Server(0.02)
    records = await run_load(plans(5, 3), Load("concurrency", 2), server, max_duration_s=30)
    assert len(records) == 15 and server.peak == 2
    first = [body for sid, body in server.bodies if sid == "s0"]
    assert first[0] == {"reply_was": None} and first[1]["reply_was"].startswith("reply ")


async def test_a_failed_request_ends_its_session() -> None:
    server = Server(0.01, fail_session="s1")
    records = await run_load(plans(3, 4), Load("concurrency", 1), server, max_duration_s=30)
    assert sum(1 for r in records if r.session_id == "s1") == 1
    assert len(records) == 9


async def test_poisson_rate_is_kept_and_sessions_are_capped() -> None:
    server = Server(0.05)
    started = time.perf_counter()
    records = await run_load(plans(40, 3), Load("rate", 40.0), server, max_duration_s=2.0, max_active_sessions=4)
    elapsed = time.perf_counter() - started
    assert 50 <= len(records) <= 110  # about 2 s x 40/s
    # at most 4 sessions open, each with at most one request in flight
    assert server.peak <= 4
    assert elapsed < 3.0


async def test_trace_mode_follows_arrival_times() -> None:
    server = Server(0.01)
    timed = [SessionPlan("mooncake", KEY, "g", OneShotScript({"n": i}), arrival_s=i * 0.1) for i in range(4)]
    records = await run_load(timed, Load("trace", 2.0), server, max_duration_s=30)
    starts = sorted(r.start_s for r in records)
    assert [round(s, 1) for s in starts] == pytest.approx([0.0, 0.2, 0.4, 0.6], abs=0.06)
