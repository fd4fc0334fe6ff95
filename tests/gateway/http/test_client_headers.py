"""`x-session-affinity` and `cf-aig-metadata`: read as UTF-8, bounded in characters, keys once.

Headers go in as the raw bytes a client sends (Starlette decodes them as latin-1 itself); the
end-to-end test sends them to a real gateway and reads its ledger record.
"""

from __future__ import annotations

import json

import httpx
import pytest
from starlette.requests import Request

from gateway.errors import InvalidInput
from gateway.fleet.catalog import DEFAULT_MODEL_ID
from gateway.http.client_headers import metadata, session_id
from tests.gateway.fixtures_e2e import InProcessGateway


def request(*headers: tuple[str, bytes]) -> Request:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/",
        "headers": [(name.encode(), value) for name, value in headers],
        "state": {"client_request_id": None},
    }
    return Request(scope)


def test_non_ascii_values_are_read_as_utf8_not_latin1() -> None:
    assert session_id(request(("x-session-affinity", "zoë-Ω-会话".encode()))) == "zoë-Ω-会话"
    sent = json.dumps({"user": "zoë", "city": "Zürich"}, ensure_ascii=False).encode()
    assert metadata(request(("cf-aig-metadata", sent))) == {"user": "zoë", "city": "Zürich"}


def test_length_limits_count_characters_not_bytes() -> None:
    assert session_id(request(("x-session-affinity", ("é" * 256).encode()))) == "é" * 256  # 512 bytes
    with pytest.raises(InvalidInput, match="1 to 256 characters"):
        session_id(request(("x-session-affinity", ("é" * 257).encode())))
    long_value = json.dumps({"k": "é" * 256}, ensure_ascii=False).encode()
    assert metadata(request(("cf-aig-metadata", long_value))) == {"k": "é" * 256}


@pytest.mark.parametrize("name", ["x-session-affinity", "cf-aig-metadata"])
def test_invalid_utf8_is_a_400_naming_the_header(name: str) -> None:
    with pytest.raises(InvalidInput, match=f"{name} is not valid UTF-8") as refused:
        (session_id if name == "x-session-affinity" else metadata)(request((name, b'{"a": "\xff\xfe"}')))
    assert refused.value.status == 400


def test_a_key_sent_twice_is_refused_naming_it() -> None:
    with pytest.raises(InvalidInput, match="the key 'team' appears more than once") as refused:
        metadata(request(("cf-aig-metadata", b'{"team": "a", "job": 1, "team": "b"}')))
    assert refused.value.status == 400 and str(refused.value).startswith("cf-aig-metadata: ")


@pytest.mark.slow
def test_the_ledger_keeps_what_the_client_sent(gateway: InProcessGateway) -> None:
    secret = gateway.new_key("t-utf8", "acc-utf8")
    headers = [
        (b"authorization", f"Bearer {secret}".encode()),
        (b"x-session-affinity", "sesión-ü".encode()),
        (b"cf-aig-metadata", json.dumps({"user": "zoë"}, ensure_ascii=False).encode()),
    ]
    answer = httpx.post(
        f"{gateway.url}/client/v4/accounts/acc-utf8/ai/run/{DEFAULT_MODEL_ID}",
        json={"prompt": "hi", "max_tokens": 2},
        headers=headers,
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    record = gateway.ledger_record(answer.headers["cf-ray"])
    assert record.session_id == "sesión-ü" and record.metadata == {"user": "zoë"}
    twice = httpx.post(
        f"{gateway.url}/client/v4/accounts/acc-utf8/ai/run/{DEFAULT_MODEL_ID}",
        json={"prompt": "hi", "max_tokens": 2},
        headers={"authorization": f"Bearer {secret}", "cf-aig-metadata": '{"a": 1, "a": 2}'},
        timeout=120,
    )
    assert twice.status_code == 400 and "'a' appears more than once" in twice.json()["errors"][0]["message"]
