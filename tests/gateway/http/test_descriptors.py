"""File descriptors (gateway/http/descriptors.py): connection caps fitted under the open-file
limit, the rate-limited refusal log, and a real `edgerun serve` under a low limit whose admin
listener still answers while the public one is full (before, uvloop reset both, silently)."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from structlog.testing import capture_logs

from cli.processes import free_port
from gateway.http.descriptors import (
    BASE_RESERVE,
    MIN_PUBLIC_CONNECTIONS,
    RefusalLog,
    connection_caps,
    reserved_descriptors,
)
from gateway.settings import GatewaySettings
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, GatewayProcess


def test_under_systemds_default_limit_the_caps_leave_room_for_the_reserve_and_the_admin_listener() -> None:
    caps = connection_caps(limit=1024, reserve=400, max_connections=10_000, has_admin=True)
    assert caps.admin is not None and caps.admin >= 16 and not caps.is_starved
    assert caps.public + caps.admin + caps.reserve <= 1024
    assert connection_caps(1024, 400, 10_000, has_admin=False).public == 1024 - 400


def test_a_generous_limit_keeps_the_setting() -> None:
    caps = connection_caps(limit=524_288, reserve=400, max_connections=10_000, has_admin=True)
    assert (caps.public, caps.admin) == (10_000, 10_000)


def test_a_limit_below_the_reserve_is_starved_but_keeps_minimum_caps() -> None:
    caps = connection_caps(limit=256, reserve=400, max_connections=10_000, has_admin=True)
    assert caps.is_starved and caps.public == MIN_PUBLIC_CONNECTIONS and caps.admin == 16


def test_the_reserve_counts_backend_connections_polls_and_the_redis_pool(tmp_path: Path) -> None:
    backends = [{"id": f"b{i}", "base_url": f"http://127.0.0.1:{9000 + i}", "models": ["m"]} for i in range(3)]
    base = {"sqlite_path": str(tmp_path / "g.sqlite3"), "backends": backends, "backend_max_connections": 100}
    embedded = reserved_descriptors(GatewaySettings(redis_url=None, **base))
    assert embedded == BASE_RESERVE + 100 + 3 * 4
    with_redis = GatewaySettings(redis_url="redis://127.0.0.1:6379/0", redis_max_connections=50, **base)
    assert reserved_descriptors(with_redis) == embedded + 50


def test_refusals_are_logged_at_most_once_per_interval_with_their_count() -> None:
    now = [0.0]
    refusals = RefusalLog("public", interval_s=10.0, clock=lambda: now[0])
    with capture_logs() as logs:
        for step in range(25):
            now[0] = step * 1.0
            refusals.refused(405)
    lines = [entry for entry in logs if entry["event"].startswith("connections refused")]
    assert [line["refused"] for line in lines] == [1, 10, 10]  # at 0 s, 10 s, 20 s
    assert lines[0]["listener"] == "public" and lines[0]["max_connections"] == 405


LIMITED = (  # python -c LIMITED <args>: python <args> under these limits (a systemd unit's LimitNOFILE, say)
    "import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@pytest.fixture
def limited_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    """`edgerun serve` with an admin listener, started under a soft limit of 256 and a hard one of 512."""
    port, admin_port = free_port(), free_port()
    argv = [sys.executable, "-c", LIMITED.format(soft=256, hard=512), "-m", "cli", "serve",
            "--port", str(port), "--admin-port", str(admin_port)]
    env = {
        "EDGERUN_SQLITE_PATH": str(tmp_path / "g.sqlite3"),
        "EDGERUN_ADMIN_TOKEN": ADMIN_TOKEN,
        "EDGERUN_BACKEND_MAX_CONNECTIONS": "16",
        "EDGERUN_MAX_CONNECTIONS_PER_CLIENT": "1000",  # one test address may fill the listener
        "EDGERUN_HEADERS_TIMEOUT_S": "60",  # idle connections stay for the test's length
        "EDGERUN_LOG_JSON": "false",
    }
    gateway = GatewayProcess.launch("limited gateway", argv, port, env=env)
    gateway.admin_port = admin_port  # type: ignore[attr-defined]
    try:
        gateway.wait_ready()
        yield gateway
    finally:
        gateway.stop()


@pytest.mark.slow
def test_a_full_public_listener_leaves_the_admin_listener_answering_and_says_so(limited_gateway: GatewayProcess) -> None:
    gw = limited_gateway
    limits = Path(f"/proc/{gw.process.pid}/limits").read_text()
    assert any(line.startswith("Max open files") and line.split()[3] == "512" for line in limits.splitlines()), limits
    held: list[socket.socket] = []
    try:
        for _ in range(600):  # more than the whole limit: before, accept() hit EMFILE and uvloop reset both listeners
            held.append(socket.create_connection(("127.0.0.1", gw.port), timeout=5))
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as extra:
            extra.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert extra.recv(64).startswith(b"HTTP/1.1 503"), "a full listener answers 503, it does not reset"
        admin = httpx.get(f"http://127.0.0.1:{gw.admin_port}/admin/v1/tenants",  # type: ignore[attr-defined]
                          headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10)
        assert admin.status_code == 200, admin.text
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10
    while "connections refused" not in gw.log():
        assert time.monotonic() < deadline, gw.log_tail()
        time.sleep(0.1)
    log = gw.log()
    assert "open-file limit raised" in log and "max_connections lowered to fit the open-file limit" in log
