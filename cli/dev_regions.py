"""`edgerun dev --regions N --wan-rtt-ms RTT`: N regions on this machine, an emulated WAN of round trip
RTT between each and the home region (cli/regions.py, cli/wan.py).

1. starts the Redis servers (home's record and tenancy; each other region's store and tenancy
   replica) and the WAN links, in a folder of their own (`--regions-dir`, else a temporary one);
2. starts one backend per region (`edgerun backend --model ... --region NAME`, behind one random
   backend key, as `edgerun dev` does) and waits until each is healthy;
3. starts an `edgerun serve` per region (home on `--port`, the others on the ports after it; home's
   admin API on `--admin-port`), creates the development tenant and a key at home, and waits until
   the key works in every region;
4. prints each region's gateway URL, the key, and the home admin URL; Ctrl-C stops them all.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from cli.processes import ChildProcess, ProcessError, free_port
from cli.regions import Region, Regions, region_names
from gateway.fleet.catalog import DEFAULT_MODEL_ID, default_models

DEV_ACCOUNT = "dev"
BACKEND_START_TIMEOUT_S = 600.0
KEY_EVERYWHERE_TIMEOUT_S = 10.0


def spawn_backend(args: argparse.Namespace, region: str, api_key: str) -> ChildProcess:
    options = ["--model", args.model, "--region", region, "--log-level", args.log_level]
    return ChildProcess.spawn(
        f"the backend of {region}", "backend", options, port=free_port(), env={"EDGERUN_API_KEY": api_key},
        keep_edgerun_env=True, inherit_output=True,
    )


def dev_key(home_admin: str, admin_token: str) -> str:
    """The development tenant (created once) and a fresh key for it, made at home."""
    headers = {"authorization": f"Bearer {admin_token}"}
    with httpx.Client(base_url=home_admin, headers=headers, timeout=10) as http:
        tenants = http.get("/admin/v1/tenants").raise_for_status().json()["result"]
        found = [t for t in tenants if DEV_ACCOUNT in t["account_ids"]]
        if found:
            tenant_id = found[0]["id"]
        else:
            body = {"name": "Development", "account_ids": [DEV_ACCOUNT], "id": "dev"}
            tenant_id = http.post("/admin/v1/tenants", json=body).raise_for_status().json()["result"]["id"]
        return str(http.post(f"/admin/v1/tenants/{tenant_id}/keys", json={}).raise_for_status().json()["result"]["secret"])


def wait_key_everywhere(regions: Regions, secret: str) -> None:
    """Until every region knows the key (its tenancy replica has it)."""
    deadline = time.monotonic() + KEY_EVERYWHERE_TIMEOUT_S
    for region in regions.regions:
        while httpx.get(f"{region.url}/client/v4/accounts/{DEV_ACCOUNT}/ai/models/search",
                        headers={"authorization": f"Bearer {secret}"}, timeout=5).status_code == 401:  # fmt: skip
            if time.monotonic() > deadline:
                raise ProcessError(f"the development key did not reach {region.name} in {KEY_EVERYWHERE_TIMEOUT_S:.0f} s")
            time.sleep(0.05)


def banner(args: argparse.Namespace, regions: Regions, secret: str, admin_token: str) -> str:
    lines = [f"\nedgerun is running in {len(regions.regions)} regions, {args.wan_rtt_ms:g} ms round trip from home:"]
    for region in regions.regions:
        what = "home (the global record)" if region.replica is None else "reaches home through the emulated WAN"
        lines.append(f"  {region.name:<10} gateway {region.url}   ({what})")
    lines += [
        f"development key, valid in every region (account {DEV_ACCOUNT!r}): {secret}",
        f"home admin API: http://127.0.0.1:{args.admin_port}  (admin token: {admin_token})",
        f"stores and logs: {regions.workdir}",
        "",
        "try, in each region:",
        "",
        f"  curl {regions.regions[-1].url}/client/v4/accounts/{DEV_ACCOUNT}/ai/run/{DEFAULT_MODEL_ID} "
        f"-H 'Authorization: Bearer {secret}' -d '{{\"prompt\": \"Hello\", \"max_tokens\": 16}}'",
        "",
        "Ctrl-C stops them all.",
    ]
    return "\n".join(lines)


async def serve_regions(args: argparse.Namespace) -> int:
    workdir = Path(args.regions_dir) if args.regions_dir else Path(tempfile.mkdtemp(prefix="edgerun-regions-"))
    backend_key, admin_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
    regions = Regions(workdir, args.wan_rtt_ms)
    backends: dict[str, ChildProcess] = {}
    try:
        regions.start_stores(region_names(args.regions))
        for region in regions.regions:
            backends[region.name] = spawn_backend(args, region.name, backend_key)
        print(f"starting {len(backends)} backends ({args.model}) ...", flush=True)
        for backend in backends.values():
            await asyncio.to_thread(backend.wait_ready, "/health", BACKEND_START_TIMEOUT_S)

        def region_backends(region: Region) -> list[dict[str, Any]]:
            return [{"id": f"{region.name}-1", "base_url": backends[region.name].url, "region": region.name}]

        env = {"EDGERUN_ADMIN_TOKEN": admin_token, "EDGERUN_BACKEND_API_KEY": backend_key,
               "EDGERUN_LOG_LEVEL": args.log_level}
        for region in regions.regions:
            region.env["EDGERUN_SQLITE_PATH"] = str(workdir / region.name / "gateway.sqlite3")  # its spool's folder
        models = [m.model_dump(mode="json") for m in default_models()]
        first = regions.regions[0]
        await asyncio.to_thread(
            regions.start_gateways, region_backends, env, models=models, inherit_output=True,
            args=lambda region: ["--admin-port", str(args.admin_port)] if region is first else [],
            ports=lambda region: args.port + regions.regions.index(region),
        )
        secret = dev_key(f"http://127.0.0.1:{args.admin_port}", admin_token)
        await asyncio.to_thread(wait_key_everywhere, regions, secret)
        print(banner(args, regions, secret, admin_token), flush=True)
        while all(r.gateway is not None and r.gateway.process.poll() is None for r in regions.regions):
            await asyncio.sleep(0.5)
        return 1
    except ProcessError as exc:
        print(exc, flush=True)
        return 1
    finally:
        regions.stop()
        for backend in backends.values():
            backend.stop(timeout_s=15)
