"""benchmarks/gateway/overhead.py end to end: the shared stub backend as a real process, `edgerun
serve` in front of it, both sides driven in interleaved rounds, and the report table."""

from __future__ import annotations

import pytest

from benchmarks.gateway.overhead import main

pytestmark = pytest.mark.slow


def test_short_run_reports_both_sides(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--duration", "0.4", "--concurrency", "2", "--chunks", "3"]) == 0
    out = capsys.readouterr().out
    assert "| metric | direct to stub | through gateway | added |" in out
    rows = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in out.splitlines() if line.startswith("| ")
    }
    direct, through = (int(cell.split(" ")[0]) for cell in rows["requests (errors)"][:2])
    assert direct > 0 and through > 0
    assert "(0)" in rows["requests (errors)"][1]  # no request through the gateway failed


def test_chunks_spaced_by_the_stub_take_that_long(capsys: pytest.CaptureFixture[str]) -> None:
    """`--chunk-delay-ms`: every answer, direct or through the gateway, takes at least its chunks' pauses."""
    assert main(["--duration", "0.4", "--concurrency", "2", "--chunks", "4", "--chunk-delay-ms", "10"]) == 0
    out = capsys.readouterr().out
    assert "4 chunks per answer 10 ms before each" in out
    rows = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in out.splitlines() if line.startswith("| ")
    }
    direct_p50, through_p50 = (float(cell) for cell in rows["latency p50 (ms)"][:2])
    assert direct_p50 >= 40 and through_p50 >= 40, rows["latency p50 (ms)"]
    assert "(0)" in rows["requests (errors)"][1]


def test_half_capacity_rate_and_a_baseline_tree(capsys: pytest.CaptureFixture[str]) -> None:
    """`--rate half` measures capacity first; `--baseline-tree` adds a second gateway (here the same tree)."""
    from cli.processes import ROOT

    args = ["--duration", "0.4", "--concurrency", "2", "--chunks", "3", "--rate", "half", "--baseline-tree", str(ROOT)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "half the gateway's closed-loop capacity" in out
    assert "| metric | direct to stub | through gateway | through baseline gateway |" in out


def test_report_takes_each_side_against_its_own_direct_route() -> None:
    """With a router: the gateway's added latency is over the stub's completions route, the router's over
    the stub's chat route; the last line gives the gateway's CPU and requests/s as multiples of the router's."""
    import argparse

    from benchmarks.gateway.overhead import report
    from benchmarks.gateway.raw_load import Phase

    def phase(name: str, latency_ms: float, num: int, cpu_s: float = 0.0) -> Phase:
        return Phase(name, [latency_ms / 1000] * num, 0, 1.0, cpu_s)

    phases = [
        phase("direct", 2.0, 1000),
        phase("direct-chat", 3.0, 1000),
        phase("gateway", 12.0, 400, cpu_s=0.4),  # 1.00 ms per request
        phase("router", 4.0, 800, cpu_s=0.2),  # 0.25 ms per request
    ]
    args = argparse.Namespace(concurrency=10, chunks=8, chunk_delay_ms=0.0, duration=1.0, quickack=True)
    out = report(phases, args, "python -m benchmarks.gateway.overhead --router sglang", None, {})
    assert (
        "| metric | direct to stub | direct to stub (chat) | through gateway | through SGLang router "
        "| added (gateway) | added (router) |" in out
    )
    assert "| latency p50 (ms) | 2.00 | 3.00 | 12.00 | 4.00 | +10.00 | +1.00 |" in out
    assert "| gateway CPU per request (ms) |  |  | 1.00 | 0.25 |  |  |" in out
    assert "keep-alive, TCP_QUICKACK" in out
    assert out.endswith("gateway 4.00x the CPU per request, 0.50x the requests/s")
    assert "Failed requests" not in out  # none failed


def test_report_names_what_failed_requests_got() -> None:
    import argparse
    from collections import Counter

    from benchmarks.gateway.overhead import report
    from benchmarks.gateway.raw_load import Phase

    failures = Counter({"503": 3, "ConnectionResetError": 1})
    samples = {"503": "too many open connections; retry later", "ConnectionResetError": "[Errno 104]"}
    phases = [Phase("direct", [0.002] * 10, 0, 1.0), Phase("gateway", [0.005] * 6, 4, 1.0, 0.01, failures, samples)]
    args = argparse.Namespace(concurrency=10, chunks=8, chunk_delay_ms=0.0, duration=1.0, quickack=False)
    out = report(phases, args, "python -m benchmarks.gateway.overhead", None, {})
    assert "| requests (errors) | 10 (0) | 6 (4) |" in out
    assert (
        "Failed requests (each kind's first answer): through gateway: 503 x3, ConnectionResetError x1 "
        "(503: 'too many open connections; retry later', ConnectionResetError: '[Errno 104]')"
    ) in out
