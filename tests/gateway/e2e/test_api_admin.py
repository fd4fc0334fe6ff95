"""The admin HTTP API: tenants and keys, guarded by the admin token."""

from __future__ import annotations

import httpx
import pytest

from gateway.fleet.catalog import DEFAULT_MODEL_ID
from tests.gateway.fixtures_e2e import ADMIN_TOKEN, InProcessGateway

pytestmark = pytest.mark.slow
ADMIN = {"authorization": f"Bearer {ADMIN_TOKEN}"}


def test_the_admin_api_needs_the_admin_token(gateway: InProcessGateway) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}):
        response = httpx.get(f"{gateway.url}/admin/v1/tenants", headers=headers, timeout=10)
        assert response.status_code == 401 and response.json()["errors"][0]["code"] == 10000


def test_tenant_and_key_lifecycle(gateway: InProcessGateway) -> None:
    base = f"{gateway.url}/admin/v1"
    created = httpx.post(
        f"{base}/tenants", json={"name": "Acme", "account_ids": ["acc-acme"], "id": "acme"}, headers=ADMIN, timeout=10
    )
    assert created.status_code == 201 and created.json()["result"]["account_ids"] == ["acc-acme"]
    again = httpx.post(
        f"{base}/tenants", json={"name": "Acme", "account_ids": ["acc-acme"], "id": "acme"}, headers=ADMIN, timeout=10
    )
    assert again.status_code == 409
    assert "acme" in [t["id"] for t in httpx.get(f"{base}/tenants", headers=ADMIN, timeout=10).json()["result"]]

    key = httpx.post(f"{base}/tenants/acme/keys", json={"rpm": 100}, headers=ADMIN, timeout=10).json()["result"]
    assert key["secret"].startswith(key["prefix"]) and key["rpm"] == 100
    listed = httpx.get(f"{base}/tenants/acme/keys", headers=ADMIN, timeout=10).json()["result"]
    assert [k["id"] for k in listed] == [key["id"]] and "secret" not in listed[0]

    run = f"{gateway.url}/client/v4/accounts/acc-acme/ai/run/{DEFAULT_MODEL_ID}"
    headers = {"authorization": f"Bearer {key['secret']}"}
    assert httpx.post(run, json={"prompt": "hi", "max_tokens": 1}, headers=headers, timeout=60).status_code == 200
    revoked = httpx.delete(f"{base}/keys/{key['id']}", headers=ADMIN, timeout=10).json()["result"]
    assert revoked["revoked_at"] is not None
    assert httpx.post(run, json={"prompt": "hi", "max_tokens": 1}, headers=headers, timeout=60).status_code == 401
    assert httpx.delete(f"{base}/keys/key_nope", headers=ADMIN, timeout=10).status_code == 404


def test_admin_input_errors(gateway: InProcessGateway) -> None:
    base = f"{gateway.url}/admin/v1"
    missing = httpx.post(f"{base}/tenants", json={"name": "x"}, headers=ADMIN, timeout=10)
    assert missing.status_code == 400 and "account_ids" in missing.json()["errors"][0]["message"]
    bad_id = httpx.post(f"{base}/tenants", json={"name": "x", "account_ids": ["has space"]}, headers=ADMIN, timeout=10)
    assert bad_id.status_code == 400
    unknown = httpx.post(f"{base}/tenants/nobody/keys", json={}, headers=ADMIN, timeout=10)
    assert unknown.status_code == 404


@pytest.mark.parametrize("field", ["rpm", "tpm"])
def test_admin_integers_beyond_64_bits_get_400(gateway: InProcessGateway, field: str) -> None:
    base = f"{gateway.url}/admin/v1"
    httpx.post(f"{base}/tenants", json={"name": "Big", "account_ids": ["acc-big"], "id": "big"}, headers=ADMIN, timeout=10)
    for value in (2**63, 2**70, -1):
        response = httpx.post(f"{base}/tenants/big/keys", json={field: value}, headers=ADMIN, timeout=10)
        assert response.status_code == 400, response.text
        assert field in response.json()["errors"][0]["message"]
    response = httpx.post(
        f"{base}/tenants", json={"name": "Big", "account_ids": ["acc-big2"], "id": "big2", "monthly_budget_micro": 2**64},
        headers=ADMIN, timeout=10,
    )
    assert response.status_code == 400 and "monthly_budget_micro" in response.json()["errors"][0]["message"]


def test_admin_json_with_nan_gets_400(gateway: InProcessGateway) -> None:
    response = httpx.post(
        f"{gateway.url}/admin/v1/tenants", content=b'{"name": "n", "account_ids": ["a"], "rpm": NaN}',
        headers=ADMIN, timeout=10,
    )
    assert response.status_code == 400 and "NaN" in response.json()["errors"][0]["message"]
