"""Several regions on this machine, with an emulated WAN between them: what `edgerun dev --regions N`
starts, and the multi-region tests and benchmark start the same way.

The home region (the first) runs two Redis servers: `home`, the global record (every region's
ledger, budget leases; also the home region's own store), and `tenancy`, where tenants and keys are
written. Every other region runs its own store (a Redis that persists, appendonly) and a read-only
replica of `tenancy` (`--replicaof`, through the WAN), and reaches home only through WAN links
(cli/wan.py): one to `home`, one to `tenancy`. Each region's gateway is an `edgerun serve` child
whose settings say which is which (`gateway/store/settings.py`, the home_* settings); its backends are
whatever `backends(region)` gives.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from cli.processes import ChildProcess, ProcessError, free_port
from cli.wan import WanLink, WanThread

REDIS_READY_TIMEOUT_S = 10.0
REPLICA_SYNC_TIMEOUT_S = 30.0
GATEWAY_READY_TIMEOUT_S = 60.0


def redis_url(port: int) -> str:
    return f"redis://127.0.0.1:{port}/0"


def _in_sync(port: int) -> bool:
    """A replica whose link to its master is up (its first full sync done)."""
    try:
        with redis.Redis(port=port, socket_connect_timeout=0.5, socket_timeout=0.5) as client:
            return bool(client.info("replication").get("master_link_status") == "up")
    except redis.RedisError:
        return False


def _answers(port: int) -> bool:
    try:
        with redis.Redis(port=port, socket_connect_timeout=0.5, socket_timeout=0.5) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


@dataclass
class RedisServer:
    """A redis-server child with its files in `workdir` (restartable on the same port); a replica
    (`--replicaof` in `options`) is started once its first sync is done."""

    name: str
    workdir: Path
    options: Sequence[str]
    port: int = 0
    process: ChildProcess | None = None

    def start(self, wait_sync: bool = True) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise ProcessError("redis-server is not installed (apt-get install redis-server)")
        self.port = self.port or free_port()
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [binary, *self.options, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir)]
        self.process = ChildProcess.launch(f"redis-{self.name}", argv, self.port)
        self.process.wait_until_ready(lambda: _answers(self.port), REDIS_READY_TIMEOUT_S, interval_s=0.05)
        if wait_sync and "--replicaof" in self.options:
            self.process.wait_until_ready(lambda: _in_sync(self.port), REPLICA_SYNC_TIMEOUT_S, interval_s=0.05)
        return self

    @property
    def url(self) -> str:
        return redis_url(self.port)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout_s=10)
            self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process = None


EPHEMERAL = ("--save", "", "--appendonly", "no")
PERSISTENT = ("--save", "", "--appendonly", "yes", "--appendfsync", "everysec")


@dataclass
class Region:
    name: str
    store: RedisServer
    replica: RedisServer | None  # None: the home region reads the tenancy Redis itself
    links: list[WanLink]  # to home: the record, the tenancy
    env: dict[str, str]  # the store settings its gateway gets
    gateway: ChildProcess | None = None

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url


@dataclass
class Regions:
    workdir: Path
    rtt_ms: float
    wan: WanThread = field(default_factory=WanThread)
    home: RedisServer | None = None
    tenancy: RedisServer | None = None
    regions: list[Region] = field(default_factory=list)

    def start_stores(self, names: Sequence[str]) -> None:
        """Home's two Redis servers, then each region's store, replica and WAN links."""
        self.home = RedisServer("home", self.workdir / "home", PERSISTENT).start()
        self.tenancy = RedisServer("tenancy", self.workdir / "tenancy", PERSISTENT).start()
        for i, name in enumerate(names):
            if i == 0:
                env = {"EDGERUN_REDIS_URL": self.home.url, "EDGERUN_HOME_REDIS_URL": self.home.url,
                       "EDGERUN_HOME_TENANCY_URL": self.tenancy.url}
                self.regions.append(Region(name, self.home, None, [], env))
                continue
            to_home = self.wan.link(self.home.port, self.rtt_ms)
            to_tenancy = self.wan.link(self.tenancy.port, self.rtt_ms)
            store = RedisServer(f"{name}-store", self.workdir / name / "store", PERSISTENT).start()
            replica_options = (*EPHEMERAL, "--replicaof", "127.0.0.1", str(to_tenancy.port), "--replica-read-only", "yes")
            replica = RedisServer(f"{name}-replica", self.workdir / name / "replica", replica_options).start()
            env = {"EDGERUN_REDIS_URL": store.url, "EDGERUN_HOME_REDIS_URL": redis_url(to_home.port),
                   "EDGERUN_HOME_TENANCY_URL": redis_url(to_tenancy.port), "EDGERUN_TENANCY_REPLICA_URL": replica.url}
            self.regions.append(Region(name, store, replica, [to_home, to_tenancy], env))

    def start_gateways(
        self,
        backends: Callable[[Region], list[dict[str, Any]]],
        env: Mapping[str, str],
        *,
        models: list[dict[str, Any]] | None = None,
        args: Callable[[Region], Sequence[str]] = lambda region: (),
        ports: Callable[[Region], int | None] = lambda region: None,
        inherit_output: bool = False,
    ) -> None:
        """An `edgerun serve` per region (home first), `env` added to each one's settings; `args`
        and `ports` (None: a free one): each region's own options and port."""

        for region in self.regions:
            settings = {**env, **region.env, "EDGERUN_REGION": region.name,
                        "EDGERUN_BACKENDS": json.dumps(backends(region))}
            if models is not None:
                settings["EDGERUN_MODELS"] = json.dumps(models)
            region.gateway = ChildProcess.spawn(
                f"gateway-{region.name}", "serve", args(region), port=ports(region), env=settings,
                inherit_output=inherit_output,
            )
        for region in self.regions:
            assert region.gateway is not None
            region.gateway.wait_ready("/healthz", GATEWAY_READY_TIMEOUT_S)

    def restart_store(self, region: Region) -> None:
        """Kill a region's Redis servers (store and replica) and start them again on their ports (the
        replica's sync from home left to happen on its own)."""
        for server in (region.store, region.replica):
            if server is not None:
                server.kill()
        for server in (region.store, region.replica):
            if server is not None:
                server.start(wait_sync=False)

    def stop(self) -> None:
        for region in self.regions:
            if region.gateway is not None:
                region.gateway.stop(timeout_s=20)
        self.wan.close()
        for region in self.regions[1:]:
            for server in (region.store, region.replica):
                if server is not None:
                    server.stop()
        for server in (self.home, self.tenancy):
            if server is not None:
                server.stop()


def region_names(count: int) -> list[str]:
    return ["home", *(f"region-{i}" for i in range(2, count + 1))]


