"""benchmarks/gateway/workers.py's load side: clients shared over client processes, and several stub
processes on one port (SO_REUSEPORT)."""

from __future__ import annotations

import httpx
import pytest

from benchmarks.gateway.workers import shares, start_stubs


def test_clients_are_shared_evenly_over_the_client_processes() -> None:
    assert shares(192, 2) == [96, 96]
    assert shares(10, 4) == [3, 3, 2, 2]
    assert shares(3, 5) == [1, 1, 1]  # no process without clients
    assert sum(shares(257, 7)) == 257


@pytest.mark.process
def test_several_stubs_share_one_port() -> None:
    stubs = start_stubs(2, 2)
    try:
        assert len({stub.port for stub in stubs}) == 1
        assert all(stub.process.poll() is None for stub in stubs)  # the second bound the port too
        for _ in range(8):  # fresh connections, spread over both by the kernel; each answers in full
            with httpx.stream("POST", f"{stubs[0].url}/v1/completions", json={"prompt": [1, 2, 3]}) as response:
                events = [line for line in response.iter_lines() if line.startswith("data: ")]
            assert response.status_code == 200 and events[-1] == "data: [DONE]" and len(events) == 2 + 2
    finally:
        for stub in stubs:
            stub.stop(timeout_s=10)
