"""The public and admin listeners over real sockets: what is served where, the metrics token,
and the per-connection limits (414, 431, 408, 503, idle keep-alive). No backend is needed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cli.processes import ChildProcess
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.pipeline.routing import EXPLAIN_REQUEST_HEADER, EXPLAIN_RESPONSE_HEADER
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, InProcessGateway, gateway_settings

ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}
METRICS_TOKEN = "metrics-token-0123456789abcdef"


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    settings = gateway_settings(
        tmp_path_factory.mktemp("listeners"), [],
        admin_port=0,  # a separate admin listener (InProcessGateway picks a free port)
        metrics_public=False,
        max_request_line_bytes=1024, max_header_bytes=8192, max_headers=20,
        headers_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=0.5, max_connections_per_client=8,
        admin_max_failures=3, admin_failure_window_s=1.0,
    )
    started = InProcessGateway(settings).start()
    yield started
    started.stop()


def exchange(port: int, data: bytes, *, close_after_send: bool = False, timeout_s: float = 5.0) -> bytes:
    """Send raw bytes and read until the server closes the connection (or `timeout_s`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        if close_after_send:
            return b""
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def test_admin_paths_and_metrics_live_on_the_admin_listener_only(split: InProcessGateway) -> None:
    assert httpx.get(f"{split.url}/admin/v1/tenants", headers=ADMIN).status_code == 404
    assert httpx.get(f"{split.admin_url}/admin/v1/tenants", headers=ADMIN).status_code == 200
    assert httpx.get(f"{split.url}/metrics").status_code == 404
    assert "edgerun_gateway_requests_total" in httpx.get(f"{split.admin_url}/metrics").text
    run = f"/client/v4/accounts/a/ai/run/{DEFAULT_MODEL_ID}"
    assert httpx.post(f"{split.admin_url}{run}", json={"prompt": "x"}).status_code == 404
    assert httpx.post(f"{split.url}{run}", json={"prompt": "x"}).status_code == 401  # served, needs a key
    assert httpx.get(f"{split.url}/healthz").status_code == httpx.get(f"{split.admin_url}/healthz").status_code == 200


def test_the_admin_token_must_come_as_bearer(split: InProcessGateway) -> None:
    bare = httpx.get(f"{split.admin_url}/admin/v1/tenants", headers={"authorization": ADMIN_TOKEN})
    assert bare.status_code == 401 and bare.json()["errors"][0]["code"] == 10000


def test_failed_admin_attempts_are_throttled(split: InProcessGateway) -> None:
    url = f"{split.admin_url}/admin/v1/tenants"
    time.sleep(1.0)  # the window of earlier failures (the bare-token test) has passed
    for _ in range(3):
        assert httpx.get(url, headers={"authorization": "Bearer wrong"}).status_code == 401
    throttled = httpx.get(url, headers=ADMIN)  # even the right token, while throttled
    assert throttled.status_code == 429 and throttled.json()["errors"][0]["code"] == 971
    assert throttled.headers["retry-after"] == "1"
    time.sleep(1.05)
    assert httpx.get(url, headers=ADMIN).status_code == 200


def test_metrics_on_a_lone_public_listener_needs_the_metrics_token(tmp_path: Path) -> None:
    gateway = InProcessGateway(gateway_settings(tmp_path, [], metrics_public=False, metrics_token=METRICS_TOKEN)).start()
    try:
        assert httpx.get(f"{gateway.url}/metrics").status_code == 401
        assert httpx.get(f"{gateway.url}/metrics", headers={"authorization": "Bearer " + "x" * 30}).status_code == 401
        ok = httpx.get(f"{gateway.url}/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"})
        assert ok.status_code == 200 and "edgerun_gateway_requests_total" in ok.text
        assert httpx.get(f"{gateway.url}/admin/v1/tenants", headers=ADMIN).status_code == 200  # one listener: all here
    finally:
        gateway.stop()


def test_request_line_header_size_and_count_are_bounded(split: InProcessGateway) -> None:
    ok = exchange(split.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(ok) == 200
    long_url = b"GET /healthz?" + b"q" * 2000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    assert status_of(exchange(split.port, long_url)) == 414
    big_header = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 16_000 + b"\r\n\r\n"
    assert status_of(exchange(split.port, big_header)) == 431
    endless_header = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 16_000  # never finished
    assert status_of(exchange(split.port, endless_header)) == 431
    many = b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(30)) + b"\r\n"
    assert status_of(exchange(split.port, many)) == 431


def test_slow_headers_slow_bodies_and_idle_connections_are_closed(split: InProcessGateway) -> None:
    start = time.monotonic()
    assert status_of(exchange(split.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n")) == 408  # headers never end
    assert status_of(exchange(split.port, b"")) == 408  # a connection that sends nothing is closed too
    body = b"POST /admin/v1/tenants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{"
    assert status_of(exchange(split.admin_port or 0, body % ADMIN_TOKEN.encode())) == 408
    idle = exchange(split.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # kept alive, then idle
    assert status_of(idle) == 200
    assert time.monotonic() - start < 4.0  # four deadlines of 0.5 s each, not uvicorn's forever


def test_connections_per_client_address_are_capped(split: InProcessGateway) -> None:
    held = [socket.create_connection(("127.0.0.1", split.port), timeout=5) for _ in range(8)]
    try:
        time.sleep(0.1)
        refused = exchange(split.port, b"")  # answered at once, before any request is read
        assert status_of(refused) == 503
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert status_of(exchange(split.port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")) == 200


def test_a_client_that_leaves_mid_body_is_a_499_not_an_error(split: InProcessGateway) -> None:
    partial = b"POST /admin/v1/tenants HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100\r\n\r\n{"
    exchange(split.admin_port or 0, partial % ADMIN_TOKEN.encode(), close_after_send=True)
    time.sleep(0.3)
    metrics = httpx.get(f"{split.admin_url}/metrics").text
    assert 'route="/admin/v1/tenants",status="499"' in metrics
    assert 'route="/admin/v1/tenants",status="500"' not in metrics


def test_the_dashboard_takes_the_admin_token_on_the_admin_listener_only(split: InProcessGateway) -> None:
    assert httpx.get(f"{split.url}/dashboard/api/tenants", headers=ADMIN).status_code == 401
    assert httpx.get(f"{split.admin_url}/dashboard/api/tenants", headers=ADMIN).status_code == 200
    assert httpx.get(f"{split.url}/dashboard").status_code == 200  # the page itself, for tenants


def test_an_answer_before_the_body_ends_drains_it_and_keeps_the_connection(split: InProcessGateway) -> None:
    path = f"/client/v4/accounts/a/ai/run/{DEFAULT_MODEL_ID}".encode()
    body = b"x" * 200_000
    request = b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path, len(body), body)
    with socket.create_connection(("127.0.0.1", split.port), timeout=5) as sock:
        for _ in range(2):  # no key: 401 before the body is read; the rest is read and dropped, not a reset
            sock.sendall(request)
            head = sock.recv(65536)
            assert status_of(head) == 401
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            received = len(head.split(b"\r\n\r\n", 1)[1])
            while received < length:
                received += len(sock.recv(65536))


def test_the_listen_backlog_comes_from_the_settings(tmp_path: Path) -> None:
    from gateway.http.listeners import listener_configs
    from gateway.settings import GatewaySettings

    async def app(scope: object, receive: object, send: object) -> None: ...

    settings = GatewaySettings(sqlite_path=str(tmp_path / "g.sqlite3"), listen_backlog=1234, admin_port=0)
    assert [config.backlog for config in listener_configs(settings, app)] == [1234, 1234]  # type: ignore[arg-type]


def test_wrong_explain_headers_on_the_public_listener_do_not_lock_the_operator_out(
    stub_backend: ChildProcess, tmp_path: Path
) -> None:
    """One failure table for both listeners, keyed by address: a tenant's wrong x-edgerun-explain
    headers made the admin listener answer 429 to the right admin token for a minute."""
    from tests.gateway import stub_backend as stub

    backends = [{"id": "stub", "base_url": stub_backend.url, "region": "local", "models": [stub.MODEL_ID]}]
    settings = gateway_settings(
        tmp_path, backends, models=[{"id": stub.MODEL_ID, "backend_model": "stub", "block_size": 16}],
        admin_port=0, admin_max_failures=3, admin_failure_window_s=60.0,
    )
    gw = InProcessGateway(settings).start()
    try:
        key = gw.new_key("t-explain", "acc-explain")
        url = f"{gw.url}/client/v4/accounts/acc-explain/ai/run/{stub.MODEL_ID}"
        for explain in ["wrong"] * 3 + [ADMIN_TOKEN]:
            answer = httpx.post(url, json={"prompt": "x"}, timeout=30,
                                headers={"authorization": f"Bearer {key}", EXPLAIN_REQUEST_HEADER: explain})
            assert answer.status_code == 200 and EXPLAIN_RESPONSE_HEADER not in answer.headers  # the last: throttled
        admin = httpx.get(f"{gw.admin_url}/admin/v1/tenants", headers=ADMIN, timeout=10)
        assert admin.status_code == 200, admin.text
    finally:
        gw.stop()
