"""`edgerun tenants` / `edgerun keys`: straight on a store, and through a running gateway."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from cli.main import main
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, InProcessGateway


@pytest.fixture(autouse=True)
def keep_test_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() configures process-wide logging onto the (temporary) captured stderr: not in tests."""
    monkeypatch.setattr("cli.main.configure_logging", lambda **options: None)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> object:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_on_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("EDGERUN_SQLITE_PATH", str(tmp_path / "g.sqlite3"))
    monkeypatch.delenv("EDGERUN_REDIS_URL", raising=False)
    tenant = cli(capsys, "tenants", "create", "--name", "Acme", "--account", "a1", "--account", "a2", "--id", "acme")
    assert tenant["account_ids"] == ["a1", "a2"]  # type: ignore[index]
    assert [t["id"] for t in cli(capsys, "tenants", "list")] == ["acme"]  # type: ignore[union-attr,index]
    key = cli(capsys, "keys", "create", "--tenant", "acme", "--rpm", "5", "--model", DEFAULT_MODEL_ID)
    assert key["secret"].startswith("edg_") and key["allowed_models"] == [DEFAULT_MODEL_ID]  # type: ignore[index]
    listed = cli(capsys, "keys", "list", "--tenant", "acme")
    assert [k["id"] for k in listed] == [key["id"]] and "secret" not in listed[0]  # type: ignore[index,union-attr]
    assert cli(capsys, "keys", "revoke", key["id"])["revoked_at"] is not None  # type: ignore[index]
    assert main(["keys", "list", "--tenant", "nobody"]) == 1
    assert "no tenant" in capsys.readouterr().err


@pytest.mark.slow
def test_through_a_running_gateway(gateway: InProcessGateway, capsys: pytest.CaptureFixture[str]) -> None:
    remote = ("--gateway", gateway.url, "--admin-token", ADMIN_TOKEN)
    cli(capsys, "tenants", "create", *remote, "--name", "Remote", "--account", "acc-remote", "--id", "remote")
    key = cli(capsys, "keys", "create", *remote, "--tenant", "remote")
    response = httpx.post(
        f"{gateway.url}/client/v4/accounts/acc-remote/ai/run/{DEFAULT_MODEL_ID}",
        json={"prompt": "hi", "max_tokens": 1},
        headers={"authorization": f"Bearer {key['secret']}"},
        timeout=60,  # type: ignore[index]
    )
    assert response.status_code == 200  # the running gateway sees the key at once
