"""benchmarks/gateway/threads.py end to end: the stub backend and `edgerun serve` as real processes,
a short open-loop phase, and each thread's CPU per request in the report."""

from __future__ import annotations

import os
import threading

import pytest

from benchmarks.gateway.threads import main, thread_cpu_s
from cli.processes import ROOT

pytestmark = pytest.mark.slow


def test_every_thread_of_a_process_is_read() -> None:
    """Python 3.11 does not name the OS thread: threads of one name are told apart by index."""
    before = thread_cpu_s(os.getpid())
    stop = threading.Event()
    waiter = threading.Thread(target=lambda: stop.wait(5))
    waiter.start()
    try:
        during = thread_cpu_s(os.getpid())
    finally:
        stop.set()
        waiter.join()
    assert len(during) == len(before) + 1, (before, during)
    assert all(seconds >= 0 for seconds in during.values())


def test_short_run_reports_cpu_per_request_by_thread_and_by_round(capsys: pytest.CaptureFixture[str]) -> None:
    """Two gateways (this checkout twice, as `--tree` would name another), two rounds each."""
    argv = ["--rate", "40", "--seconds", "0.5", "--rounds", "2", "--chunks", "3", "--concurrency", "2"]
    assert main([*argv, "--tree", str(ROOT)]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| /")]
    assert len(rows) == 4, out  # each tree: its totals, then its rounds
    for tree, requests, cpu_ms, threads in rows[:2]:
        assert tree.strip() == str(ROOT) and int(requests) > 0 and float(cpu_ms) > 0, out
        assert "python:0" in threads  # the gateway's main thread: its event loop
    (_, first_rounds, no_ratio), (_, rounds, ratio) = rows[2:]
    assert len(first_rounds.split()) == len(rounds.split()) == 2 and not no_ratio.strip(), out
    values = [float(ms) for ms in rounds.split()]
    median, low_high = ratio.split()
    low, high = (float(x) for x in low_high.strip("()").split("-"))
    first = [float(ms) for ms in first_rounds.split()]
    assert low <= float(median) <= high and low == pytest.approx(min(v / f for v, f in zip(values, first)), abs=5e-3)
