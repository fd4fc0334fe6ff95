"""Admission before work: a request is counted against its key's requests per minute before its
body is read, so invalid requests count and a key over its limit costs no parsing (issue 18, item 4)."""

from __future__ import annotations

import httpx
import pytest

from gateway.catalog import DEFAULT_MODEL_ID
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
