"""Two regions on loopback with an emulated WAN (cli/regions.py), the stub backend behind each: what
the multi-region tests and the benchmark (benchmarks/gateway/regions.py) start.

`two_regions(rtt_ms)` yields a `Regions` whose gateways are up (home first), `Admin` speaks to the
home region's admin API, `ask` sends one request to a region's gateway.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from cli.regions import Regions, region_names
from tests.gateway.stub_backend import ADMIN_TOKEN, MODEL_ID, PROMPT, start_stub

ACCOUNT_PATH = "/client/v4/accounts/{account}/ai/run/" + MODEL_ID


@contextlib.contextmanager
def two_regions(workdir: Path, rtt_ms: float, **settings: str) -> Iterator[Regions]:
    """Home and "region-2", `rtt_ms` apart; `settings`: more EDGERUN_* for both gateways."""
    stub = start_stub(num_chunks=4)
    regions = Regions(workdir, rtt_ms)
    try:
        regions.start_stores(region_names(2))
        env = {
            "EDGERUN_ADMIN_TOKEN": ADMIN_TOKEN,
            "EDGERUN_LOG_LEVEL": "warning",
            "EDGERUN_TOKENIZER_CACHE_DIR": str(workdir / "tokenizers"),
            **settings,
        }
        models = [{"id": MODEL_ID, "backend_model": "stub", "block_size": 16}]

        def backends(region: Any) -> list[dict[str, Any]]:
            return [{"id": f"stub-{region.name}", "base_url": stub.url, "region": region.name, "models": [MODEL_ID]}]

        for region in regions.regions:  # each gateway's own files (its ledger spool) in its own folder
            region.env["EDGERUN_SQLITE_PATH"] = str(workdir / region.name / "gateway.sqlite3")
        regions.start_gateways(backends, env, models=models)
        yield regions
    finally:
        regions.stop()
        stub.stop()


class Admin:
    """The home region's admin API."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}

    def _call(self, method: str, path: str, **options: Any) -> httpx.Response:
        answer = httpx.request(method, self.base + path, headers=self.headers, timeout=10, **options)
        answer.raise_for_status()
        return answer

    def tenant(self, account: str, **fields: Any) -> str:
        answer = self._call("POST", "/admin/v1/tenants", json={"name": account, "account_ids": [account], **fields})
        return str(answer.json()["result"]["id"])

    def key(self, tenant_id: str) -> tuple[str, str]:
        """(key id, secret)."""
        answer = self._call("POST", f"/admin/v1/tenants/{tenant_id}/keys", json={})
        result = answer.json()["result"]
        return str(result["id"]), str(result["secret"])

    def revoke(self, key_id: str) -> None:
        self._call("DELETE", f"/admin/v1/keys/{key_id}")

    def export(self, tenant_id: str) -> list[dict[str, Any]]:
        """The tenant's rows in the home region's billing export (today and tomorrow, UTC)."""
        today = datetime.now(UTC).date()
        params = {"from": today.isoformat(), "to": (today + timedelta(days=2)).isoformat(), "tenant": tenant_id,
                  "format": "jsonl"}
        answer = self._call("GET", "/admin/v1/billing/export", params=params)

        return [json.loads(line) for line in answer.text.splitlines() if line.strip()]


def body(stream: bool = False, max_tokens: int = 8) -> dict[str, Any]:
    return {"prompt": PROMPT, "max_tokens": max_tokens, "stream": stream}


def ask(http: httpx.Client, base: str, account: str, secret: str, stream: bool = False,
        max_tokens: int = 8) -> httpx.Response:  # fmt: skip
    """One request (a stream read to its end)."""
    url = base + ACCOUNT_PATH.format(account=account)
    headers = {"authorization": f"Bearer {secret}"}
    if not stream:
        return http.post(url, json=body(False, max_tokens), headers=headers)
    with http.stream("POST", url, json=body(True, max_tokens), headers=headers) as answer:
        answer.read()
        return answer


def wait_for(predicate: Any, timeout_s: float, interval_s: float = 0.01) -> float:
    """Seconds until `predicate()` held (AssertionError after `timeout_s`)."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(interval_s)
    return time.monotonic() - start
