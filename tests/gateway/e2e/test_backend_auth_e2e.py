"""A gateway in front of a backend that requires its API key, over real HTTP on loopback.

The gateway must send the key on every backend request (tokenizer, health, load, KV events,
generation), and the `cache_salt` it sends must be the tenant's HMAC, not the tenant id.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from contracts.prefix_hash import salt_root
from gateway.pipeline.tenant_salt import derive_cache_salt
from tests.gateway.fixtures_e2e import BackendProcess, InProcessGateway, gateway_settings, running_tiny_backend

pytestmark = pytest.mark.slow
BACKEND_KEY = "e2e-backend-key-0123456789abcdef"
SALT_SECRET = "e2e-salt-secret-0123456789"
MODEL = "@cf/test/tiny"
AUTH = {"authorization": f"Bearer {BACKEND_KEY}"}


@pytest.fixture(scope="module")
def backend() -> Iterator[BackendProcess]:
    with running_tiny_backend("keyed", env={"EDGERUN_API_KEY": BACKEND_KEY}) as process:
        yield process


@pytest.fixture(scope="module")
def gateway(backend: BackendProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessGateway]:
    settings = gateway_settings(
        tmp_path_factory.mktemp("keyed"),
        [backend.spec([MODEL])],
        models=[{"id": MODEL, "backend_model": "random:tiny"}],
        backend_api_key=BACKEND_KEY,
        cache_salt_secret=SALT_SECRET,
        health_interval_s=0.2,
        kv_events_interval_s=0.2,
    )
    started = InProcessGateway(settings).start()
    yield started
    started.stop()


def test_the_gateway_reaches_a_keyed_backend_with_an_unguessable_salt(
    gateway: InProcessGateway, backend: BackendProcess
) -> None:
    with httpx.Client(base_url=backend.url, timeout=30) as direct:
        direct.post("/kv_cache_events", params={"consumer": "test"}, headers=AUTH)  # start a cursor of our own
        secret = gateway.new_key("tenant-e2e", "acc-e2e")
        url = f"{gateway.url}/client/v4/accounts/acc-e2e/ai/run/{MODEL}"
        # greedy: a sampled answer from the random tiny model may end at its first token
        body = {"prompt": "tell me a long story about the sea " * 3, "max_tokens": 2, "raw": True, "temperature": 0}
        answer = httpx.post(url, json=body, headers={"authorization": f"Bearer {secret}"}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["result"]["usage"]["completion_tokens"] == 2
        events = direct.post("/kv_cache_events", params={"consumer": "test"}, headers=AUTH).json()
    roots = {e["data"]["parent_hash"] for e in events if e["data"]["type"] == "stored"}
    expected = salt_root(derive_cache_salt(SALT_SECRET.encode(), "tenant-e2e"))
    assert expected in roots, events  # the chain starts at the HMAC salt ...
    assert salt_root("tenant-e2e") not in roots  # ... not at the tenant id anyone could send
