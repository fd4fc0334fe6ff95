"""GET /admin/v1/billing/export and the cf-aig-metadata header, through the real app."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from gateway.billing.export import ExportQuery, write_export
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.http.app import create_app
from gateway.settings import GatewaySettings
from gateway.store import Store
from tests.gateway.billing.ledger_data import CURRENT, HISTORY, OLD, fill, records

ADMIN = {"authorization": "Bearer admin-secret-0123456789abcdefghijklmnop"}
URL = "/admin/v1/billing/export"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = GatewaySettings(
        redis_url=None,
        sqlite_path=str(tmp_path / "gateway.sqlite3"),  # the `store` fixture's file
        tokenizer_cache_dir=None,
        admin_token="admin-secret-0123456789abcdefghijklmnop",
        prices=CURRENT,
        price_history=OLD,
    )
    with TestClient(create_app(settings)) as test_client:
        yield test_client


async def test_the_endpoint_serves_the_same_bytes_as_the_export(store: Store, client: TestClient) -> None:
    await fill(store, records())
    query = {"from": "2027-01-15T07:00:00Z", "to": "2027-01-15T09:00:00Z"}
    for fmt in ("csv", "jsonl", "parquet"):
        rows, summary = io.BytesIO(), io.BytesIO()
        await write_export(store.ledger, ExportQuery.parse(query["from"], query["to"]), HISTORY, fmt, rows, summary)
        answer = client.get(URL, params={**query, "format": fmt}, headers=ADMIN)
        assert answer.status_code == 200 and answer.content == rows.getvalue(), fmt
        assert answer.headers["content-disposition"] == f'attachment; filename="billing-rows.{fmt}"'
        totals = client.get(URL, params={**query, "format": fmt, "part": "summary"}, headers=ADMIN)
        assert totals.content == summary.getvalue()
    zeta = client.get(URL, params={**query, "format": "jsonl", "tenant": "zeta"}, headers=ADMIN).text.splitlines()
    assert zeta and all(json.loads(line)["tenant_id"] == "zeta" for line in zeta)


def test_the_endpoint_checks_token_and_parameters(client: TestClient) -> None:
    ok = {"from": "2027-01-15", "to": "2027-01-16"}
    assert client.get(URL, params=ok).status_code == 401
    assert client.get(URL, params=ok, headers={"authorization": "Bearer nope"}).status_code == 401
    for params, where in [
        ({"to": "2027-01-16"}, "from is required"),
        ({**ok, "format": "xlsx"}, "format must be one of csv, jsonl, parquet"),
        ({**ok, "part": "all"}, "part must be one of rows, summary"),
        ({**ok, "from": "2027-13-01"}, "ISO 8601"),
        ({**ok, "tenant": "bad tenant!"}, "tenant"),
    ]:
        answer = client.get(URL, params=params, headers=ADMIN)
        assert answer.status_code == 400, params
        error = answer.json()["errors"][0]
        assert error["code"] == 5004 and where in error["message"], (params, error)
    empty = client.get(URL, params=ok, headers=ADMIN)
    assert empty.status_code == 200 and empty.text.startswith("request_id,tenant_id,") and empty.text.count("\n") == 1


def test_cf_aig_metadata_must_be_a_small_json_object_of_scalars(client: TestClient) -> None:
    tenant = client.post("/admin/v1/tenants", json={"name": "m", "account_ids": ["acc-m"]}, headers=ADMIN).json()
    secret = client.post(f"/admin/v1/tenants/{tenant['result']['id']}/keys", json={}, headers=ADMIN).json()
    auth = {"authorization": f"Bearer {secret['result']['secret']}"}
    url = f"/client/v4/accounts/acc-m/ai/run/{DEFAULT_MODEL_ID}"
    body = {"prompt": "hi", "max_tokens": 2}
    for bad in ["not json", "[1, 2]", '"text"', json.dumps({f"k{i}": i for i in range(6)}), '{"nested": {"a": 1}}',
                '{"list": [1]}', '{"none": null}']:
        answer = client.post(url, json=body, headers={**auth, "cf-aig-metadata": bad})
        assert answer.status_code == 400, bad
        error = answer.json()["errors"][0]
        message = error["message"]
        assert error["code"] == 5004 and message.startswith("cf-aig-metadata: "), bad
        assert "flat JSON object of at most 5 string, number or boolean values" in message, bad
    good = json.dumps({"k0": "v", "k1": 1, "k2": 2.5, "k3": True, "k4": "five"})
    answer = client.post(url, json=body, headers={**auth, "cf-aig-metadata": good})
    assert answer.status_code != 400  # accepted; no backend is configured here, so it cannot be served
