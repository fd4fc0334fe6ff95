"""Admission before work: a request is counted against its key's requests per minute before its
body is read, so invalid requests count and a key over its limit costs no parsing (issue 18, item 4)."""

from __future__ import annotations

import httpx
import pytest

from gateway.fleet.catalog import DEFAULT_MODEL_ID
from tests.gateway.fixtures_e2e import InProcessGateway

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("route", [f"ai/run/{DEFAULT_MODEL_ID}", "ai/v1/chat/completions"])
def test_refused_requests_count_and_a_key_over_its_limit_is_not_parsed(gateway: InProcessGateway, route: str) -> None:
    account = f"acc-adm-{len(route)}"
    secret = gateway.new_key(account, account, rpm=1)
    url = f"{gateway.url}/client/v4/accounts/{account}/{route}"
    headers = {"authorization": f"Bearer {secret}", "content-type": "application/json"}
    invalid = httpx.post(url, content=b'{"messages": [', headers=headers, timeout=30)
    assert invalid.status_code == 400  # parsed: the key had a request left, and it is now used
    over = httpx.post(url, content=b'{"messages": [', headers=headers, timeout=30)
    assert over.status_code == 429, over.text  # not parsed at all: refused for the limit first
    assert "3040" in over.text and 1 <= int(over.headers["retry-after"]) <= 120


def test_a_stream_admitted_before_its_key_is_revoked_runs_to_its_end(gateway: InProcessGateway) -> None:
    """The decision documented in SECURITY.md ("Key revocation"), as Cloudflare's tokens behave:
    revocation refuses the next request at once; a stream already admitted finishes and is billed."""
    assert gateway.store is not None
    store = gateway.store
    secret = gateway.new_key("t-rev", "acc-rev")
    url = f"{gateway.url}/client/v4/accounts/acc-rev/ai/run/{DEFAULT_MODEL_ID}"
    headers = {"authorization": f"Bearer {secret}"}
    body = {"prompt": "Count from one to twenty:", "max_tokens": 16, "stream": True, "temperature": 0}

    async def revoke() -> None:
        key = await store.tenancy.lookup_key(secret)
        assert key is not None and await store.tenancy.revoke_key(key.id)

    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as stream:
        assert stream.status_code == 200
        request_id = stream.headers["cf-ray"]
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        gateway.call(revoke())
        assert httpx.post(url, json={"prompt": "x", "max_tokens": 1}, headers=headers, timeout=30).status_code == 401
        rest = [line for line in lines if line.startswith("data: ")]
    assert first != "data: [DONE]" and rest[-1] == "data: [DONE]" and '"usage"' in rest[-2]
    record = gateway.call(store.ledger.get(request_id))
    assert record is not None and record.status == "ok"
