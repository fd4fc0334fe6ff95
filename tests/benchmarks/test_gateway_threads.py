"""benchmarks/gateway_threads.py end to end: the stub backend and `edgerun serve` as real processes,
a short open-loop phase, and each thread's CPU per request in the report."""

from __future__ import annotations

import os
import threading

import pytest

from benchmarks.gateway_threads import main, thread_cpu_s

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


def test_short_run_reports_cpu_per_request_by_thread(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--rate", "40", "--seconds", "0.5", "--rounds", "1", "--chunks", "3", "--concurrency", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| /")]
    assert len(rows) == 1, out
    _, tree, requests, cpu_ms, threads, _ = rows[0].split("|")
    assert int(requests) > 0 and float(cpu_ms) > 0, rows[0]
    assert "python:0" in threads  # the gateway's main thread: its event loop
