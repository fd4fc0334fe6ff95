"""Two regions on loopback, an emulated WAN between them (cli/regions.py, the stub backend): what a
request costs in each region, what crosses the WAN, how fast tenancy and the ledger get around.

    python -m benchmarks.gateway.regions [--rtt-ms 0,50,100,200] [--requests 200] [--trials 10]

One topology (tests/gateway/regional/topology.py) whose WAN round trip is set in turn to each
`--rtt-ms`. At each:

- request latency: `--requests` sequential requests (non-streaming and streaming), alternating
  home and region 2 one by one, so both see the same machine; p50 and p99 of each;
- store round trips per request, on each path: the commands each Redis server got from clients
  (its MONITOR; a script is one, what it runs inside is not counted) over 50 streamed requests
  sent to one region, divided by them, background loops included (region 2's shipper: its blocking
  reads, and its batches home); the chunks the WAN links carried towards home say the same from the link;
- propagation: a key created at home until it is accepted in region 2, a revoked key until it is
  refused there (polled every 2 ms), `--trials` times each;
- ledger shipping lag: a request answered in region 2 until its record is in the home Redis
  (its idempotency key), `--trials` times.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import redis

from benchmarks.common import machine
from cli.regions import RedisServer, Regions
from tests.gateway.regional.topology import Admin, ask, two_regions

ACCOUNT = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Commands:
    """The commands clients send one Redis server (its MONITOR, leaving out those scripts run inside):
    a script or a command is one round trip, a pipeline one for all its commands."""

    def __init__(self, server: RedisServer) -> None:
        self.port = server.port
        self.count = 0
        self._stopping = False
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def _watch(self) -> None:
        with redis.Redis(port=self.port) as client, client.monitor() as monitor:
            self._ready.set()
            while not self._stopping:
                command = monitor.next_command()
                if command["client_type"] == "tcp" and not self._stopping:
                    self.count += 1

    def stop(self) -> int:
        self._stopping = True
        with redis.Redis(port=self.port) as client:
            client.ping()  # wakes the watcher
        self._thread.join(5)
        return self.count


def until(predicate: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.002) -> float:
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout_s:
            return float("inf")
        time.sleep(interval_s)
    return time.perf_counter() - start


def latency(regions: Regions, secret: str, stream: bool, n: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {r.name: [] for r in regions.regions}
    with httpx.Client(timeout=30) as http:
        for _ in range(n):
            for region in regions.regions:
                start = time.perf_counter()
                answer = ask(http, region.url, ACCOUNT, secret, stream)
                times[region.name].append((time.perf_counter() - start) * 1000)
                assert answer.status_code == 200, answer.text
    return times


def commands_per_request(regions: Regions, secret: str, n: int) -> dict[str, dict[str, float]]:
    """Per region: commands each Redis server processed per request sent there, and WAN chunks."""
    assert regions.home is not None and regions.tenancy is not None
    second = regions.regions[1]
    servers = {"home": regions.home, "tenancy": regions.tenancy, "region-2 store": second.store}
    if second.replica is not None:
        servers["region-2 replica"] = second.replica
    found: dict[str, dict[str, float]] = {}
    with httpx.Client(timeout=30) as http:
        for region in regions.regions:
            watching = {name: Commands(s) for name, s in servers.items()}
            chunks = sum(link.chunks_to_home for link in second.links)
            for _ in range(n):
                assert ask(http, region.url, ACCOUNT, secret, True).status_code == 200
            time.sleep(1.0)  # the last records shipped
            found[region.name] = {name: w.stop() / n for name, w in watching.items()}
            found[region.name]["WAN chunks"] = (sum(link.chunks_to_home for link in second.links) - chunks) / n
    return found


def answers(http: httpx.Client, base: str, secret: str, status: int) -> bool:
    return ask(http, base, ACCOUNT, secret, max_tokens=1).status_code == status


def propagation(regions: Regions, admin: Admin, tenant_id: str, trials: int) -> tuple[list[float], list[float]]:
    second = regions.regions[1]
    created, revoked = [], []
    with httpx.Client(timeout=10) as http:
        for _ in range(trials):
            start = time.perf_counter()
            key_id, secret = admin.key(tenant_id)
            made = time.perf_counter()
            took = until(functools.partial(answers, http, second.url, secret, 200))
            created.append((made - start) / 2 + took)  # from the write's midpoint at home
            start = time.perf_counter()
            admin.revoke(key_id)
            done = time.perf_counter()
            took = until(functools.partial(answers, http, second.url, secret, 401))
            revoked.append((done - start) / 2 + took)
    return [s * 1000 for s in created], [s * 1000 for s in revoked]


def shipping_lag(regions: Regions, secret: str, trials: int) -> list[float]:
    assert regions.home is not None
    second = regions.regions[1]
    lags = []
    with httpx.Client(timeout=10) as http, redis.Redis(port=regions.home.port) as home:
        for _ in range(trials):
            answer = ask(http, second.url, ACCOUNT, secret)
            answered = time.perf_counter()
            key = f"edgerun:ledger_req:{answer.headers['cf-ray']}"
            until(functools.partial(home.exists, key), interval_s=0.001)
            lags.append((time.perf_counter() - answered) * 1000)
    return lags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtt-ms", default="0,50,100,200")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args(argv)
    print(machine(), flush=True)
    with tempfile.TemporaryDirectory() as workdir, two_regions(Path(workdir), 0.0) as regions:
        admin = Admin(regions.regions[0].url)
        tenant_id = admin.tenant(ACCOUNT)
        _, secret = admin.key(tenant_id)
        until(lambda: ask(httpx.Client(), regions.regions[1].url, ACCOUNT, secret).status_code == 200)
        latency(regions, secret, False, 20)  # warm
        cells: dict[str, list[str]] = {"plain": [], "streamed": [], "tenancy": []}
        rtts = [float(x) for x in args.rtt_ms.split(",")]
        for rtt in rtts:
            regions.wan.set_rtt(rtt)
            time.sleep(0.5)
            plain = latency(regions, secret, False, args.requests)
            streamed = latency(regions, secret, True, args.requests)
            created, revoked = propagation(regions, admin, tenant_id, args.trials)
            lag = shipping_lag(regions, secret, args.trials)
            for name, times in (("plain", plain), ("streamed", streamed)):
                cells[name].append("; ".join(f"{statistics.median(t):.1f} / {percentile(t, 0.99):.0f}" for t in times.values()))
            cells["tenancy"].append(" / ".join(f"{statistics.median(x):.0f}" for x in (created, revoked, lag)))
            print(f"rtt {rtt:g} ms: created {sorted(created)}, revoked {sorted(revoked)}, shipping lag {sorted(lag)}", flush=True)
            if rtt == 100:
                for region, counts in commands_per_request(regions, secret, 50).items():
                    print(f"rtt 100 ms, per streamed request in {region}: "
                          + ", ".join(f"{k} {v:.2f}" for k, v in counts.items()), flush=True)
        print("| WAN round trip (ms) | " + " | ".join(f"{r:g}" for r in rtts) + " |")
        print("| --- |" + " ---: |" * len(rtts))
        labels = {"plain": "p50 / p99 ms: home; region 2", "streamed": "streamed, the same",
                  "tenancy": "key created / revoked / record shipped, until seen in region 2 (home), median ms"}
        for name, label in labels.items():
            print(f"| {label} | " + " | ".join(cells[name]) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
