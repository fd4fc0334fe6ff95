"""`edgerun keys revoke` on the SQLite file of a running `edgerun serve` reaches that gateway.

The local store keeps tenants and keys in memory; another process (the CLI) writing the same
file must be seen within the store's refresh period (`sqlite_refresh_s`), never silently ignored.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from cli.processes import ROOT
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, start_gateway_process

pytestmark = pytest.mark.slow


def edgerun(env: dict[str, str], *argv: str) -> Any:
    """The real CLI in its own process, on the gateway's SQLite file."""
    done = subprocess.run(
        [sys.executable, "-m", "cli", *argv], cwd=ROOT, env={**os.environ, **env},
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def models_status(url: str, secret: str) -> int:
    """An authenticated route that needs no backend."""
    headers = {"authorization": f"Bearer {secret}"}
    return httpx.get(f"{url}/client/v4/accounts/acc-cli/ai/models/search", headers=headers, timeout=10).status_code


def wait_status(url: str, secret: str, expected: int, within_s: float) -> int:
    deadline = time.monotonic() + within_s
    while (status := models_status(url, secret)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return status


def test_the_cli_revokes_a_key_of_a_running_gateway(tmp_path: Path) -> None:
    sqlite = str(tmp_path / "gateway.sqlite3")
    env = {"EDGERUN_SQLITE_PATH": sqlite, "EDGERUN_REDIS_URL": "", "EDGERUN_LOG_LEVEL": "warning"}
    edgerun(env, "tenants", "create", "--name", "Cli", "--account", "acc-cli", "--id", "t-cli")
    before = edgerun(env, "keys", "create", "--tenant", "t-cli")
    gateway = start_gateway_process({**env, "EDGERUN_ADMIN_TOKEN": ADMIN_TOKEN})
    try:
        gateway.wait_ready()
        assert models_status(gateway.url, before["secret"]) == 200
        after = edgerun(env, "keys", "create", "--tenant", "t-cli")  # created while it runs
        assert wait_status(gateway.url, after["secret"], 200, within_s=2.0) == 200

        revoked = edgerun(env, "keys", "revoke", before["id"])
        assert revoked["revoked_at"] is not None
        assert wait_status(gateway.url, before["secret"], 401, within_s=2.0) == 401  # at most ~1 s stale
        listing = httpx.get(
            f"{gateway.url}/admin/v1/tenants/t-cli/keys", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
        ).json()["result"]
        assert {k["id"]: k["revoked_at"] is not None for k in listing} == {before["id"]: True, after["id"]: False}
        assert models_status(gateway.url, after["secret"]) == 200
    finally:
        gateway.stop()
