"""The listener attacks of issue 18 against a gateway, before and after, in one run.

    python -m benchmarks.attack.listeners --baseline DIR [--header-mb 128] [--half-open 1500] [--flood-s 10]

For each code tree (`--baseline DIR`, e.g. an export of main before the fix, then this checkout)
it starts `edgerun serve` from that tree in front of the stub backend (tests/gateway/stub_backend.py)
and runs, one after another:

1. header flood: 4 clients each send one request whose header is `--header-mb` MB; the gateway's
   RSS before, at its peak and 3 s after, what each client got, /healthz latency meanwhile;
2. half-open requests: `--half-open` connections (50 per loopback source address, 127.0.0.2...)
   send half a request head and wait; how many the gateway still holds open over time;
3. large-body flood (item 4): 3 clients post 1 MB `messages` bodies in a closed loop on a key
   limited to 1 request per minute, for `--flood-s` seconds; /healthz and another tenant's small
   requests are timed before (quiet) and during the flood, and the gateway's CPU is read.

The probes run every 50 ms from this process. Everything shares the machine: on a busy host the
absolute numbers move between runs; compare the two trees within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from benchmarks.common import machine, process_cpu_s, rss_mb
from cli.processes import ROOT, ChildProcess, free_port
from tests.gateway import stub_backend
from tests.gateway.stub_backend import MODEL_ID

ADMIN_TOKEN = "bench-admin-token-0123456789abcdefghij"
PROBE_INTERVAL_S = 0.05


def percentiles(samples_ms: list[float]) -> str:
    if not samples_ms:
        return "n/a"
    ordered = sorted(samples_ms)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {statistics.median(ordered):.1f} / p99 {p99:.1f} / max {ordered[-1]:.1f} ms (n={len(ordered)})"


class Gateway:
    """`edgerun serve` run from one code tree, with two tenants: `flood_key` (rpm=1) and `other_key`."""

    def __init__(self, tree: Path, stub_port: int, workdir: Path) -> None:
        self.port = free_port()
        module = "cli" if (tree / "cli" / "__main__.py").exists() else "gateway.cli"
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGERUN_")}
        env.update({
            "PYTHONPATH": str(tree),
            "EDGERUN_SQLITE_PATH": str(workdir / "gateway.sqlite3"),
            "EDGERUN_ADMIN_TOKEN": ADMIN_TOKEN,
            "EDGERUN_TOKENIZER_CACHE_DIR": str(workdir / "tokenizers"),
            "EDGERUN_LOG_LEVEL": "error",
            **stub_backend.gateway_env(stub_port),
        })
        self.log = (workdir / "gateway.log").open("wb")
        argv = [sys.executable, "-m", module, "serve", "--port", str(self.port)]
        self.process = subprocess.Popen(argv, cwd=tree, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"the gateway from {tree} did not start; see {workdir / 'gateway.log'}")
            time.sleep(0.2)
        self.flood_key = self._key("flood", rpm=1)
        self.other_key = self._key("other")

    def _key(self, account: str, **limits: int) -> str:
        admin = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        tenant = httpx.post(
            f"{self.url}/admin/v1/tenants", json={"name": account, "account_ids": [account]}, headers=admin
        ).json()["result"]
        created = httpx.post(f"{self.url}/admin/v1/tenants/{tenant['id']}/keys", json=limits, headers=admin)
        return created.json()["result"]["secret"]

    def run_url(self, account: str) -> str:
        return f"{self.url}/client/v4/accounts/{account}/ai/run/{MODEL_ID}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@contextmanager
def probing(request: Callable[[httpx.Client], object]) -> Iterator[list[float]]:
    """Times `request` every PROBE_INTERVAL_S on a thread until the block ends; yields the ms list."""
    samples: list[float] = []
    stop = threading.Event()

    def loop() -> None:
        with httpx.Client(timeout=60) as client:
            while not stop.is_set():
                start = time.perf_counter()
                try:
                    request(client)
                except httpx.HTTPError:
                    pass
                samples.append((time.perf_counter() - start) * 1000)
                stop.wait(PROBE_INTERVAL_S)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        stop.set()
        thread.join(timeout=70)


def header_flood(gw: Gateway, header_mb: int, clients: int = 4) -> list[str]:
    before = rss_mb(gw.process.pid)
    outcomes: list[str] = []
    peak = [before]

    def attack() -> None:
        chunk = b"a" * (1 << 20)
        try:
            with socket.create_connection(("127.0.0.1", gw.port), timeout=60) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ")
                for _ in range(header_mb):
                    sock.sendall(chunk)
                sock.sendall(b"\r\n\r\n")
                outcomes.append(sock.recv(64).split(b"\r\n", 1)[0].decode(errors="replace") or "closed")
        except OSError as exc:
            outcomes.append(f"closed by the gateway ({type(exc).__name__})")

    with probing(lambda c: c.get(f"{gw.url}/healthz")) as healthz:
        threads = [threading.Thread(target=attack) for _ in range(clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            peak.append(rss_mb(gw.process.pid))
            time.sleep(0.05)
    time.sleep(3.0)
    after = rss_mb(gw.process.pid)
    return [
        f"- header flood, {clients} clients x {header_mb} MB: RSS {before:.0f} MB before, {max(peak):.0f} MB peak, "
        f"{after:.0f} MB 3 s after; clients got: {', '.join(sorted(set(outcomes)))}",
        f"- /healthz during the header flood: {percentiles(healthz)}",
    ]


def half_open(gw: Gateway, count: int, hold_s: float) -> list[str]:
    sockets: list[socket.socket] = []
    for i in range(count):
        sock = socket.socket()
        sock.bind((f"127.0.0.{2 + i // 50}", 0))
        sock.connect(("127.0.0.1", gw.port))
        sock.sendall(b"POST /client/v4/accounts/x/ai/run/m HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
        sockets.append(sock)
    opened = time.monotonic()
    checkpoints = [1.0, 5.0, 12.0, hold_s]
    held: list[str] = []
    with probing(lambda c: c.get(f"{gw.url}/healthz")) as healthz:
        for at in sorted(set(c for c in checkpoints if c <= hold_s)):
            time.sleep(max(0.0, opened + at - time.monotonic()))
            held.append(f"{sum(is_open(s) for s in sockets)} at {at:g} s")
    for sock in sockets:
        sock.close()
    return [
        f"- {count} half-sent request heads: still open {', '.join(held)}",
        f"- /healthz while they are held: {percentiles(healthz)}",
    ]


def is_open(sock: socket.socket) -> bool:
    """True while the gateway neither answered nor closed the connection."""
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # an answer (408) or the end of the stream
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def large_body_flood(gw: Gateway, seconds: float) -> list[str]:
    big = json.dumps({"messages": [{"role": "user", "content": "hello world " * 80} for _ in range(1000)]}).encode()
    flood_headers = {"authorization": f"Bearer {gw.flood_key}", "content-type": "application/json"}
    other = {"authorization": f"Bearer {gw.other_key}"}
    small = {"prompt": "hello", "max_tokens": 8}

    def healthz(c: httpx.Client) -> object:
        return c.get(f"{gw.url}/healthz")

    def tenant(c: httpx.Client) -> object:
        return c.post(gw.run_url("other"), json=small, headers=other)

    with probing(healthz) as quiet_health, probing(tenant) as quiet_tenant:
        time.sleep(3.0)
    statuses: dict[int, int] = {}
    stop = threading.Event()

    def flood() -> None:
        with httpx.Client(timeout=120) as client:
            while not stop.is_set():
                try:
                    status = client.post(gw.run_url("flood"), content=big, headers=flood_headers).status_code
                except httpx.HTTPError:
                    status = 0
                statuses[status] = statuses.get(status, 0) + 1

    cpu_before = process_cpu_s(gw.process.pid)
    with probing(healthz) as loud_health, probing(tenant) as loud_tenant:
        threads = [threading.Thread(target=flood) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(seconds)
        stop.set()
        for t in threads:
            t.join(timeout=120)
    cpu = process_cpu_s(gw.process.pid) - cpu_before
    total = sum(statuses.values())
    return [
        f"- 1 MB bodies on an rpm=1 key, 3 clients for {seconds:g} s: {total} requests "
        f"({', '.join(f'{n} x {s}' for s, n in sorted(statuses.items()))}), gateway CPU {cpu:.2f} s",
        f"- /healthz quiet: {percentiles(quiet_health)}; during the flood: {percentiles(loud_health)}",
        f"- other tenant (8 tokens) quiet: {percentiles(quiet_tenant)}; during the flood: {percentiles(loud_tenant)}",
    ]


def run_tree(label: str, tree: Path, stub_port: int, args: argparse.Namespace) -> list[str]:
    with tempfile.TemporaryDirectory(prefix=f"edgerun-attack-{label}-") as tmp:
        gw = Gateway(tree, stub_port, Path(tmp))
        try:
            lines = [f"**{label}** ({tree})", ""]
            lines += header_flood(gw, args.header_mb)
            lines += half_open(gw, args.half_open, args.hold_s)
            lines += large_body_flood(gw, args.flood_s)
            return lines + [""]
        finally:
            gw.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attack.listeners", description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="code tree to compare against (e.g. main)")
    parser.add_argument("--header-mb", type=int, default=128)
    parser.add_argument("--half-open", type=int, default=1500)
    parser.add_argument("--hold-s", type=float, default=15.0, help="how long half-open requests are watched")
    parser.add_argument("--flood-s", type=float, default=10.0)
    args = parser.parse_args(argv)
    stub = ChildProcess.launch("stub", stub_backend.command(port := free_port()), port)
    stub.wait_ready("/health")
    try:
        lines = [f"Machine: {machine()}; load average at start {os.getloadavg()[0]:.1f}", ""]
        lines += run_tree("before", args.baseline.resolve(), stub.port, args)
        lines += run_tree("after", ROOT, stub.port, args)
    finally:
        stub.stop()
    command = "python -m benchmarks.attack.listeners " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    print("\n".join([f"`{command}`", "", *lines]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
